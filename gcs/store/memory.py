"""In-process store: for tests and throwaway clusters (nothing survives the process)."""

from __future__ import annotations

from collections.abc import Iterable

from gcs.store.base import Store, WriteBatch
from gcs.store.errors import StoreConflict, StoreUnavailable


class MemoryStore(Store):
    """Dict-backed :class:`Store`.  ``fail_writes`` simulates an outage in tests."""

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._tables: dict[str, dict[bytes, bytes]] = {}
        self._counters: dict[str, int] = {}
        self.fail_writes = False
        self.writes = 0
        self._landed: set[bytes] = set()

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _table(self, table: str) -> dict[bytes, bytes]:
        return self._tables.setdefault(table, {})

    async def get(self, table: str, key: bytes) -> bytes | None:
        return self._table(table).get(key)

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        data = self._table(table)
        return {k: data[k] for k in keys if k in data}

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return dict(self._table(table))

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        return {k: v for k, v in self._table(table).items() if k.startswith(prefix)}

    async def write(self, batch: WriteBatch) -> None:
        if self.fail_writes:
            raise StoreUnavailable("memory store: simulated outage")
        for cond in batch.conditions:
            if self._table(cond.table).get(cond.key) != cond.expected:
                raise StoreConflict(cond.table, cond.key)
        for table, key, value in batch.puts:
            self._table(table)[key] = value
        for table, key in batch.deletes:
            self._table(table).pop(key, None)
        self.writes += 1
        self._landed.add(batch.write_id)

    async def landed(self, write_id: bytes) -> bool:
        return write_id in self._landed

    async def increment(self, counter: str, by: int = 1) -> int:
        if self.fail_writes:
            raise StoreUnavailable("memory store: simulated outage")
        if by < 1:
            raise ValueError("increment must be >= 1")
        self._counters[counter] = self._counters.get(counter, 0) + by
        return self._counters[counter]

    async def read_counter(self, counter: str) -> int:
        return self._counters.get(counter, 0)
