"""Removal of a released job's exports from internal KV (gcs.managers.exported_functions)."""

from __future__ import annotations

from gcs.base.errors import Unavailable
from gcs.managers.exported_functions import export_prefixes, remove_exports
from gcs.managers.kv import KvManager
from gcs.store.memory import MemoryStore

JOB = b"\x01\x00\x00\x00"


def test_prefixes_are_rays_key_layout() -> None:
    assert export_prefixes(JOB) == [
        b"RemoteFunction:01000000:",
        b"ActorClass:01000000:",
        b"FunctionsToRun:01000000:",
    ]


async def test_only_the_jobs_keys_in_fun_are_removed() -> None:
    kv = KvManager(MemoryStore())
    mine = [b"RemoteFunction:01000000:f", b"ActorClass:01000000:A", b"FunctionsToRun:01000000:h"]
    kept = [(b"fun", b"RemoteFunction:02000000:f"), (b"other", b"RemoteFunction:01000000:f")]
    for key in mine:
        await kv.put(b"fun", key, b"x", overwrite=True)
    for namespace, key in kept:
        await kv.put(namespace, key, b"x", overwrite=True)
    assert await remove_exports(kv, JOB) == 3
    assert await kv.keys(b"fun", b"") == [b"RemoteFunction:02000000:f"]
    assert await kv.exists(b"other", b"RemoteFunction:01000000:f")


class _DownKv:
    async def delete(self, namespace: bytes, key: bytes, *, by_prefix: bool) -> int:
        raise Unavailable("store down")


async def test_a_failing_store_is_logged_not_raised() -> None:
    assert await remove_exports(_DownKv(), JOB) == 0  # type: ignore[arg-type]
