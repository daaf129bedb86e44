"""Where the instance manager keeps its instances: versioned, compare-and-set batches.

One global version counts successful batches (Ray's storage version).  A batch is written
only if the stored version still equals the one the writer read; otherwise
:class:`VersionConflict` and nothing is written.

- :class:`StoreInstanceStorage`: embedded in ``gcs serve``, in the GCS's own store (one row
  per instance plus the version row, one atomic batch guarded by a condition on the
  version row), so a restarted GCS resumes its launches.
- :class:`MemoryInstanceStorage`: tests and throwaway runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gcs.autoscaler.instances.model import Instance, decode_instance, encode_instance
from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_META
from gcs.store.errors import StoreConflict

__all__ = [
    "InstanceStorage",
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
