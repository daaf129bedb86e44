"""InternalKV (``ray.rpc.InternalKVGcsService``) over the KV table, Ray's key encoding.

Ray stores every namespace in one table; a non-empty namespace ``ns`` prefixes the key with
``@namespace_<ns>:`` (gcs-server.md §6.2).  We read through to the store (Ray does not preload
KV either) so memory stays flat however much the cluster writes.
"""

from __future__ import annotations

from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_KV

MAX_KEY_BYTES = 64 * 1024


def encode_key(namespace: bytes, key: bytes) -> bytes:
    if namespace:
        return b"@namespace_" + namespace + b":" + key
    return key


def _prefix(namespace: bytes) -> bytes:
    return encode_key(namespace, b"")


class KvManager:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def get(self, namespace: bytes, key: bytes) -> bytes | None:
        return await self._store.get(TABLE_KV, encode_key(namespace, key))

    async def multi_get(self, namespace: bytes, keys: list[bytes]) -> dict[bytes, bytes]:
        encoded = {encode_key(namespace, k): k for k in keys}
        found = await self._store.multi_get(TABLE_KV, list(encoded))
        return {encoded[k]: v for k, v in found.items()}

    async def put(self, namespace: bytes, key: bytes, value: bytes, *, overwrite: bool) -> bool:
        """Returns ``added``: False when the key already existed (Ray semantics)."""
        full = encode_key(namespace, key)
        existing = await self._store.get(TABLE_KV, full)
        if existing is not None and not overwrite:
            return False
        batch = WriteBatch().put(TABLE_KV, full, value)
        await self._store.write(batch)
        return existing is None

    async def delete(self, namespace: bytes, key: bytes, *, by_prefix: bool) -> int:
        full = encode_key(namespace, key)
        if by_prefix:
            keys = list(await self._store.scan_prefix(TABLE_KV, full))
        else:
            keys = [full] if await self._store.get(TABLE_KV, full) is not None else []
        if not keys:
            return 0
        batch = WriteBatch()
        for k in keys:
            batch.delete(TABLE_KV, k)
        await self._store.write(batch)
        return len(keys)

    async def exists(self, namespace: bytes, key: bytes) -> bool:
        return await self.get(namespace, key) is not None

    async def keys(self, namespace: bytes, prefix: bytes) -> list[bytes]:
        strip = len(_prefix(namespace))
        found = await self._store.scan_prefix(TABLE_KV, encode_key(namespace, prefix))
        if not namespace:
            # Bare keys must not pick up other namespaces' encoded keys.
            return sorted(k for k in found if not k.startswith(b"@namespace_"))
        return sorted(k[strip:] for k in found)
