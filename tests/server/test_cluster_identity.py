"""The cluster identity at a start (``gcs.managers.cluster_meta``): read or created once,
and the copies Ray's clients read from InternalKV rewritten -- in one store write, not two
round trips per key (a restart's or a takeover's path before the port binds)."""

from __future__ import annotations

from gcs.managers.cluster_meta import ClusterIdentity
from gcs.managers.kv import KvManager
from gcs.store.base import TABLE_KV, WriteBatch
from gcs.store.memory import MemoryStore
from gcs.testing.stores import _Delegating


class _CountingStore(_Delegating):
    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.kv_writes = 0

    async def write(self, batch: WriteBatch) -> None:
        if any(table == TABLE_KV for table, _, _ in batch.puts):
            self.kv_writes += 1
        await super().write(batch)


async def test_a_start_rewrites_the_published_copies_in_one_write() -> None:
    memory = MemoryStore()
    store = _CountingStore(memory)
    kv = KvManager(store)
    first = ClusterIdentity(store, kv, session_name="s1", python_version="3.11.7")
    await first.load()
    assert store.kv_writes == 1
    await kv.put(b"session", b"session_name", b"changed by a client", overwrite=True)
    await kv.put(b"cluster", b"CLUSTER_METADATA", b"{}", overwrite=True)

    store.kv_writes = 0
    again = ClusterIdentity(store, kv, session_name="s2", python_version="3.11.8")
    await again.load()
    assert store.kv_writes == 1, "existing keys too: not create-then-replace per key"
    assert again.meta.cluster_id == first.meta.cluster_id
    assert again.meta.session_name == "s1", "the stored session stays"
    assert await kv.get(b"session", b"session_name") == b"s1"
    assert await kv.get(b"cluster", b"ray_cluster_id") == first.meta.cluster_id
    metadata = await kv.get(b"cluster", b"CLUSTER_METADATA")
    assert metadata is not None and b'"python_version": "3.11.8"' in metadata
    assert await kv.get(b"__autoscaler", b"__autoscaler_v2_enabled") == b"1"
