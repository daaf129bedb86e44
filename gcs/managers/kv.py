"""InternalKV (``ray.rpc.InternalKVGcsService``) over the KV table.

Stored key encoding (one table for every namespace, as Ray does)::

    stored = b"@namespace_" + escape(namespace) + b":" + key
    escape(ns) = ns with b"%" -> b"%25", then b":" -> b"%3A"

``escape`` is injective and its output has no ``:``, so the part up to the first ``:`` after
``@namespace_`` is a prefix-free code for the namespace: (namespace, key) -> stored is
injective for every namespace *including the empty one* (``@namespace_:key``), and
``stored`` starts with ``prefix(ns) + p`` exactly when the pair is (ns, key starting with p).
So a prefix list and a prefix delete are the same range, and no client key can name another
namespace's key.  For Ray's own namespaces (no ``%`` or ``:``) the bytes are Ray's
(``@namespace_<ns>:<key>``); Ray stores empty-namespace keys raw, we cannot (they could alias).

The KV table holds client keys only: the GCS's own records (cluster id, session name,
counters, tables) live in other tables (``gcs.store.base.TABLE_META`` ...), out of reach.

Concurrency: every mutation is a conditional write (compare-and-set on presence), so
``added`` and ``deleted_num`` are exact under any interleaving, across processes too, and
reads go straight to the store (memory stays flat however much the cluster writes).
"""

from __future__ import annotations

from collections.abc import Iterable

from gcs.store import Store, StoreConflict, WriteBatch
from gcs.store.base import TABLE_KV
from gcs.store.outcome import write_definite

MAX_KEY_BYTES = 64 * 1024
# A conditional write only loses to another writer's success, so these bound livelock only.
_MAX_ATTEMPTS = 64

NAMESPACE_MARK = b"@namespace_"
_NO_LIMIT = 1 << 62
_MULTI_GET_CHUNK = 16
"""Keys read at once by a bounded MultiGet (each value may be up to ~512 MiB)."""


def _escape(namespace: bytes) -> bytes:
    return namespace.replace(b"%", b"%25").replace(b":", b"%3A")


def _unescape(escaped: bytes) -> bytes:
    return escaped.replace(b"%3A", b":").replace(b"%25", b"%")


def namespace_prefix(namespace: bytes) -> bytes:
    """Stored prefix of every key of ``namespace`` (none is a prefix of another's)."""
    return NAMESPACE_MARK + _escape(namespace) + b":"


def encode_key(namespace: bytes, key: bytes) -> bytes:
    return namespace_prefix(namespace) + key


def decode_key(stored: bytes) -> tuple[bytes, bytes]:
    """Inverse of :func:`encode_key`; ValueError for bytes it cannot have produced."""
    if not stored.startswith(NAMESPACE_MARK):
        raise ValueError(f"stored KV key {stored[:40]!r} lacks the namespace mark")
    escaped, colon, key = stored[len(NAMESPACE_MARK) :].partition(b":")
    if not colon:
        raise ValueError(f"stored KV key {stored[:40]!r} has no namespace terminator")
    return _unescape(escaped), key


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
        """Returns ``added``: False when the key already existed (Ray semantics).

        Decided by the store atomically: create-if-absent, else (``overwrite``) replace-if-
        present, retried while other writers flip the key between the two."""
        full = encode_key(namespace, key)
        for _ in range(_MAX_ATTEMPTS):
            try:
                await self._write(
                    WriteBatch().put(TABLE_KV, full, value).expect(TABLE_KV, full, None)
                )
                return True
            except StoreConflict:
                if not overwrite:
                    return False
            try:
                await self._write(
                    WriteBatch().put(TABLE_KV, full, value).expect_present(TABLE_KV, full)
                )
                return False
            except StoreConflict:
                continue
        raise StoreConflict(TABLE_KV, full, "key keeps changing under concurrent writers")

    async def publish(self, entries: Iterable[tuple[bytes, bytes, bytes]]) -> None:
        """``(namespace, key, value)`` written in one batch, whatever was there: copies the
        GCS keeps for Ray's clients (one round trip at a start, not two per key as
        :meth:`put` takes to tell whether each key was added)."""
        batch = WriteBatch()
        for namespace, key, value in entries:
            batch.put(TABLE_KV, encode_key(namespace, key), value)
        await self._write(batch)

    async def delete(self, namespace: bytes, key: bytes, *, by_prefix: bool) -> int:
        """Number of keys this call removed (exact under concurrent deletes)."""
        if not by_prefix:
            full = encode_key(namespace, key)
            try:
                await self._write(
                    WriteBatch().delete(TABLE_KV, full).expect_present(TABLE_KV, full)
                )
            except StoreConflict:
                return 0
            return 1
        scope = encode_key(namespace, key)
        for _ in range(_MAX_ATTEMPTS):
            found = await self._store.scan_prefix(TABLE_KV, scope)
            if not found:
                return 0
            batch = WriteBatch()
            for stored in found:
                batch.delete(TABLE_KV, stored).expect_present(TABLE_KV, stored)
            try:
                await self._write(batch)
            except StoreConflict:
                continue  # another caller removed one of them first: count again
            return len(found)
        raise StoreConflict(TABLE_KV, scope, "keys keep changing under concurrent deleters")

    async def exists(self, namespace: bytes, key: bytes) -> bool:
        return await self.get(namespace, key) is not None

    async def keys(
        self, namespace: bytes, prefix: bytes, *, max_bytes: int = _NO_LIMIT
    ) -> list[bytes] | None:
        """The keys starting with ``prefix``, sorted; None when their stored names add up
        to more than ``max_bytes`` (nothing more is read or built then)."""
        strip = len(namespace_prefix(namespace))
        found = await self._store.scan_keys(
            TABLE_KV, encode_key(namespace, prefix), max_bytes=max_bytes
        )
        if found is None:
            return None
        return sorted(k[strip:] for k in found)

    async def multi_get_bounded(
        self, namespace: bytes, keys: list[bytes], *, max_bytes: int
    ) -> dict[bytes, bytes] | None:
        """:meth:`multi_get` read ``_MULTI_GET_CHUNK`` keys at a time; None as soon as the
        values found add up to more than ``max_bytes``."""
        out: dict[bytes, bytes] = {}
        total = 0
        for start in range(0, len(keys), _MULTI_GET_CHUNK):
            found = await self.multi_get(namespace, keys[start : start + _MULTI_GET_CHUNK])
            for key, value in found.items():
                total += len(key) + len(value)
                if total > max_bytes:
                    return None
                out[key] = value
        return out

    async def _write(self, batch: WriteBatch) -> None:
        await write_definite(self._store, batch)
