"""Where the instance manager keeps its instances: versioned, compare-and-set batches.

One global version counts successful batches (Ray's storage version).  A batch is written
only if the stored version still equals the one the writer read; otherwise
:class:`VersionConflict` and nothing is written.

- :class:`StoreInstanceStorage`: embedded in ``gcs serve``, in the GCS's own store (one row
  per instance plus the version row, one atomic batch guarded by a condition on the
  version row), so a restarted GCS resumes its launches.
- :class:`KvInstanceStorage`: a standalone autoscaler, in the target GCS's InternalKV.
- :class:`MemoryInstanceStorage`: tests and throwaway runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

from gcs.autoscaler.instances.model import Instance, decode_instance, encode_instance
from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_META
from gcs.store.errors import StoreConflict

__all__ = [
    "InstanceStorage",
    "KvInstanceStorage",
    "KvPort",
    "MemoryInstanceStorage",
    "StoreInstanceStorage",
    "VersionConflict",
]

TABLE_AUTOSCALER_INSTANCE = "AUTOSCALER_INSTANCE"
VERSION_KEY = b"autoscaler_instances_version"


class VersionConflict(Exception):
    """Someone else wrote since ``expected``; nothing was written."""

    def __init__(self, expected: int, actual: int | None) -> None:
        super().__init__(f"instance storage version is {actual}, expected {expected}")
        self.expected = expected
        self.actual = actual


class InstanceStorage(Protocol):
    async def load(self) -> tuple[int, dict[str, Instance]]:
        """The stored version and every stored instance."""
        ...

    async def write(
        self, expected_version: int, upserts: Sequence[Instance], deletes: Sequence[str]
    ) -> int:
        """Write atomically if the version is still ``expected_version``; the new version."""
        ...


class MemoryInstanceStorage:
    def __init__(self) -> None:
        self.version = 0
        self.rows: dict[str, Instance] = {}
        self.fail_next: Exception | None = None

    async def load(self) -> tuple[int, dict[str, Instance]]:
        return self.version, dict(self.rows)

    async def write(
        self, expected_version: int, upserts: Sequence[Instance], deletes: Sequence[str]
    ) -> int:
        if self.fail_next is not None:
            err, self.fail_next = self.fail_next, None
            raise err
        if expected_version != self.version:
            raise VersionConflict(expected_version, self.version)
        for inst in upserts:
            self.rows[inst.instance_id] = inst
        for iid in deletes:
            self.rows.pop(iid, None)
        self.version += 1
        return self.version


class StoreInstanceStorage:
    def __init__(self, store: Store, *, table: str = TABLE_AUTOSCALER_INSTANCE) -> None:
        self._store = store
        self._table = table
        self._version_key = VERSION_KEY + b":" + table.encode()

    async def load(self) -> tuple[int, dict[str, Instance]]:
        raw_version = await self._store.get(TABLE_META, self._version_key)
        rows = await self._store.get_all(self._table)
        instances = {key.decode(): decode_instance(raw) for key, raw in rows.items()}
        return (int(raw_version) if raw_version else 0), instances

    async def write(
        self, expected_version: int, upserts: Sequence[Instance], deletes: Sequence[str]
    ) -> int:
        new_version = expected_version + 1
        current = str(expected_version).encode() if expected_version else None
        batch = WriteBatch().expect(TABLE_META, self._version_key, current)
        batch.put(TABLE_META, self._version_key, str(new_version).encode())
        for inst in upserts:
            batch.put(self._table, inst.instance_id.encode(), encode_instance(inst))
        for iid in deletes:
            batch.delete(self._table, iid.encode())
        try:
            await self._store.write(batch)
        except StoreConflict:
            raw = await self._store.get(TABLE_META, self._version_key)
            raise VersionConflict(expected_version, int(raw) if raw else 0) from None
        return new_version


class KvInstanceStorage:
    """Standalone autoscaler: all instances in ONE InternalKV value of the target GCS.

    One value per write makes every batch atomic on any GCS (Ray's has no compare-and-set),
    at the price of rewriting the whole table each batch (a few hundred bytes per instance).
    The version check is done against the last value read: a single writer is assumed, as in
    Ray (two standalone autoscalers on one cluster are a misconfiguration).
    """

    NAMESPACE = b"gcs_autoscaler"
    KEY = b"instances"

    def __init__(self, kv: KvPort) -> None:
        self._kv = kv
        self._rows: dict[str, Instance] = {}
        self._version = 0

    async def load(self) -> tuple[int, dict[str, Instance]]:
        raw = await self._kv.get(self.NAMESPACE, self.KEY)
        if raw is None:
            self._version, self._rows = 0, {}
        else:
            doc = json.loads(raw)
            self._version = int(doc["version"])
            self._rows = {
                r["id"]: decode_instance(json.dumps(r).encode()) for r in doc["instances"]
            }
        return self._version, dict(self._rows)

    async def write(
        self, expected_version: int, upserts: Sequence[Instance], deletes: Sequence[str]
    ) -> int:
        if expected_version != self._version:
            raise VersionConflict(expected_version, self._version)
        rows = dict(self._rows)
        for inst in upserts:
            rows[inst.instance_id] = inst
        for iid in deletes:
            rows.pop(iid, None)
        doc = {
            "version": expected_version + 1,
            "instances": [json.loads(encode_instance(i)) for i in rows.values()],
        }
        await self._kv.put(self.NAMESPACE, self.KEY, json.dumps(doc).encode())
        self._rows, self._version = rows, expected_version + 1
        return self._version


class KvPort(Protocol):
    async def get(self, namespace: bytes, key: bytes) -> bytes | None: ...

    async def put(self, namespace: bytes, key: bytes, value: bytes) -> None: ...
