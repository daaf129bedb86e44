"""InternalKV through real gRPC on memory, SQLite and Redis: namespaces cannot alias, the
cluster identity is out of the clients' reach, prefix deletes are scoped like prefix lists,
concurrent puts and deletes count exactly, and an ambiguous store failure is answered
truthfully (issue 12, defects 1, 3 and 5)."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import uuid
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from gcs.managers.kv import KvManager
from gcs.proto import gcs_service_pb2 as G
from gcs.server import GcsServer
from gcs.store.base import Store
from gcs.store.memory import MemoryStore
from gcs.store.redis.store import RedisStore
from gcs.store.sql.store import SqlStore
from gcs.testing.stores import FaultyStore, WriteFault, YieldingStore
from tests.conftest import Stubs, fast_config

BACKENDS = ("memory", "sqlite", "redis")


@pytest.fixture(params=BACKENDS)
def make_store(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Callable[[], Store]:
    """Builds a store on the same data each call (memory: one object that yields on every
    call, so check-await-apply races interleave as they do on a networked backend)."""
    if request.param == "memory":
        shared = YieldingStore(MemoryStore())
        return lambda: shared
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'gcs.db'}"
        return lambda: SqlStore(url)
    redis = request.getfixturevalue("redis_server")
    namespace = f"kv{uuid.uuid4().hex[:10]}"
    return lambda: RedisStore(redis.url, namespace=namespace)


@contextlib.asynccontextmanager
async def serving(store: Store) -> AsyncIterator[tuple[GcsServer, Stubs]]:
    server = GcsServer(fast_config(), store=store)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            assert server.meta is not None
            yield server, Stubs(channel, server.meta.cluster_id)
    finally:
        await server.stop()
        if not isinstance(store, YieldingStore):
            await store.close()


async def _put(stubs: Stubs, ns: bytes, key: bytes, value: bytes, overwrite: bool = True) -> bool:
    reply = await stubs.kv.InternalKVPut(
        G.InternalKVPutRequest(namespace=ns, key=key, value=value, overwrite=overwrite)
    )
    return bool(reply.added)


async def _get(stubs: Stubs, ns: bytes, key: bytes) -> bytes | None:
    reply = await stubs.kv.InternalKVGet(G.InternalKVGetRequest(namespace=ns, key=key))
    return reply.value if reply.status.code == 0 else None


async def _keys(stubs: Stubs, ns: bytes, prefix: bytes = b"") -> list[bytes]:
    reply = await stubs.kv.InternalKVKeys(G.InternalKVKeysRequest(namespace=ns, prefix=prefix))
    return list(reply.results)


async def _del(stubs: Stubs, ns: bytes, key: bytes, by_prefix: bool = False) -> int:
    reply = await stubs.kv.InternalKVDel(
        G.InternalKVDelRequest(namespace=ns, key=key, del_by_prefix=by_prefix)
    )
    return int(reply.deleted_num)


class TestNamespacesCannotAlias:
    async def test_empty_namespace_cannot_overwrite_the_cluster_id(
        self, make_store: Callable[[], Store]
    ) -> None:
        """ns=b"" + the stored form of cluster/ray_cluster_id is just another key: the
        cluster id survives, and the GCS restarts with the same id (old code: StoreCorrupt)."""
        async with serving(make_store()) as (_, stubs):
            cluster_id = stubs.cluster_id
            assert await _put(stubs, b"", b"@namespace_cluster:ray_cluster_id", b"evil")
            assert await _get(stubs, b"cluster", b"ray_cluster_id") == cluster_id
            assert await _get(stubs, b"", b"@namespace_cluster:ray_cluster_id") == b"evil"
        async with serving(make_store()) as (server, stubs):
            assert server.meta is not None and server.meta.cluster_id == cluster_id
            assert not server.meta.created

    async def test_overwriting_the_published_cluster_id_does_not_change_the_cluster(
        self, make_store: Callable[[], Store]
    ) -> None:
        """The KV copy is only published; the identity lives where InternalKV cannot write,
        and the copy is restored at the next start."""
        async with serving(make_store()) as (_, stubs):
            cluster_id = stubs.cluster_id
            await _put(stubs, b"cluster", b"ray_cluster_id", b"\x07" * 28)
            await _put(stubs, b"session", b"session_name", b"hijacked")
        async with serving(make_store()) as (server, stubs):
            assert server.meta is not None and server.meta.cluster_id == cluster_id
            assert server.meta.session_name != "hijacked"
            assert await _get(stubs, b"cluster", b"ray_cluster_id") == cluster_id

    async def test_keys_of_different_namespaces_never_collide(
        self, make_store: Callable[[], Store]
    ) -> None:
        """Pairs that the old encoding mapped to the same stored key stay distinct."""
        pairs = [
            (b"", b"@namespace_a:k"),
            (b"a", b"k"),
            (b"a:b", b"c"),
            (b"a", b"b:c"),
            (b"%3A", b"x"),
            (b":", b"x"),
            (b"", b"@namespace_:x"),
            (b"", b"x"),
        ]
        async with serving(make_store()) as (_, stubs):
            for i, (ns, key) in enumerate(pairs):
                assert await _put(stubs, ns, key, str(i).encode(), overwrite=False), (ns, key)
            for i, (ns, key) in enumerate(pairs):
                assert await _get(stubs, ns, key) == str(i).encode(), (ns, key)
            assert await _keys(stubs, b"a") == [b"b:c", b"k"]
            assert await _keys(stubs, b"a:b") == [b"c"]

    async def test_prefix_delete_in_the_empty_namespace_touches_only_its_keys(
        self, make_store: Callable[[], Store]
    ) -> None:
        """Del(ns=b"", key=b"", by_prefix) deletes exactly what Keys(ns=b"") lists; other
        namespaces, the cluster metadata and the next start are untouched."""
        async with serving(make_store()) as (_, stubs):
            cluster_id = stubs.cluster_id
            await _put(stubs, b"job", b"j1", b"1")
            await _put(stubs, b"", b"plain", b"2")
            await _put(stubs, b"", b"@namespace_job:j1", b"3")
            listed = await _keys(stubs, b"")
            assert listed == [b"@namespace_job:j1", b"plain"]
            assert await _del(stubs, b"", b"", by_prefix=True) == len(listed)
            assert await _keys(stubs, b"") == []
            assert await _get(stubs, b"job", b"j1") == b"1"
            assert await _get(stubs, b"cluster", b"CLUSTER_METADATA") is not None
        async with serving(make_store()) as (server, _):
            assert server.meta is not None and server.meta.cluster_id == cluster_id


class TestExactCounts:
    async def test_twenty_concurrent_create_if_absent_puts_have_one_winner(
        self, make_store: Callable[[], Store]
    ) -> None:
        """InternalKVPut(overwrite=False) x20 on one key: one added=True, its value stored."""
        async with serving(make_store()) as (_, stubs):
            added = await asyncio.gather(
                *(_put(stubs, b"race", b"k", str(i).encode(), overwrite=False) for i in range(20))
            )
            assert sum(added) == 1
            winner = added.index(True)
            assert await _get(stubs, b"race", b"k") == str(winner).encode()

    async def test_twenty_concurrent_overwriting_puts_report_one_addition(
        self, make_store: Callable[[], Store]
    ) -> None:
        """overwrite=True x20 on a fresh key: exactly one caller created it."""
        async with serving(make_store()) as (_, stubs):
            added = await asyncio.gather(
                *(_put(stubs, b"race", b"o", str(i).encode()) for i in range(20))
            )
            assert sum(added) == 1

    async def test_concurrent_deletes_count_each_key_once(
        self, make_store: Callable[[], Store]
    ) -> None:
        """10 deletes of one key report 1 in total; 5 prefix deletes of 10 keys report 10."""
        async with serving(make_store()) as (_, stubs):
            await _put(stubs, b"d", b"one", b"1")
            counts = await asyncio.gather(*(_del(stubs, b"d", b"one") for _ in range(10)))
            assert sum(counts) == 1
            for i in range(10):
                await _put(stubs, b"d", f"p/{i}".encode(), b"1")
            counts = await asyncio.gather(
                *(_del(stubs, b"d", b"p/", by_prefix=True) for _ in range(5))
            )
            assert sum(counts) == 10
            assert await _keys(stubs, b"d") == []


class TestExactCountsInTheManager:
    """The same races started in one loop turn, so every caller reads before anyone writes
    (through gRPC the server may happen to serve them one by one)."""

    async def test_create_if_absent_race(self, make_store: Callable[[], Store]) -> None:
        store = make_store()
        await store.open()
        try:
            kv = KvManager(store)
            added = await asyncio.gather(
                *(kv.put(b"race", b"m", str(i).encode(), overwrite=False) for i in range(20))
            )
            assert sum(added) == 1
            assert await kv.get(b"race", b"m") == str(added.index(True)).encode()
            added = await asyncio.gather(
                *(kv.put(b"race", b"n", b"v", overwrite=True) for _ in range(20))
            )
            assert sum(added) == 1
        finally:
            await store.close()

    async def test_delete_races(self, make_store: Callable[[], Store]) -> None:
        store = make_store()
        await store.open()
        try:
            kv = KvManager(store)
            await kv.put(b"d", b"one", b"1", overwrite=True)
            counts = await asyncio.gather(
                *(kv.delete(b"d", b"one", by_prefix=False) for _ in range(10))
            )
            assert sum(counts) == 1
            for i in range(10):
                await kv.put(b"d", f"p/{i}".encode(), b"1", overwrite=True)
            counts = await asyncio.gather(
                *(kv.delete(b"d", b"p/", by_prefix=True) for _ in range(5))
            )
            assert sum(counts) == 10
        finally:
            await store.close()


class TestAmbiguousStoreFailure:
    async def test_put_that_landed_is_acknowledged_despite_the_error(self) -> None:
        """The store fails after the write landed: the server learns it landed and answers
        OK (old code: UNAVAILABLE); memory and store agree."""
        store = FaultyStore(MemoryStore())
        async with serving(store) as (_, stubs):
            store.fail_next(WriteFault.AFTER)
            assert await _put(stubs, b"amb", b"k", b"v", overwrite=False)
            assert await _get(stubs, b"amb", b"k") == b"v"
            store.fail_next(WriteFault.AFTER)
            assert await _del(stubs, b"amb", b"k") == 1
            assert await _get(stubs, b"amb", b"k") is None

    async def test_put_that_did_not_land_says_nothing_was_written(self) -> None:
        """A failure before the write: UNAVAILABLE "nothing was written", and it is true."""
        store = FaultyStore(MemoryStore())
        async with serving(store) as (_, stubs):
            store.fail_next(WriteFault.BEFORE)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _put(stubs, b"amb", b"k", b"v")
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "nothing was written" in (info.value.details() or "")
            assert await _get(stubs, b"amb", b"k") is None
