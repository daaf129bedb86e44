"""In-process store: for tests and throwaway clusters (nothing survives the process).

There is no stored layout to migrate: every open starts empty, in the current layout.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from gcs.store.base import Store, WriteBatch
from gcs.store.errors import StoreConflict, StoreUnavailable

# How many recent write ids ``landed`` can answer for (memory stays bounded).
_LANDED_KEPT = 100_000


class MemoryStore(Store):
    """Dict-backed :class:`Store`.  ``fail_writes`` simulates an outage in tests."""

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._tables: dict[str, dict[bytes, bytes]] = {}
        self._counters: dict[str, int] = {}
        self.fail_writes = False
        self.writes = 0
        self._landed: set[bytes] = set()
        self._landed_order: deque[bytes] = deque()

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

    async def scan_keys(self, table: str, prefix: bytes, *, max_bytes: int) -> list[bytes] | None:
        keys, total = [], 0
        for key in self._table(table):
            if key.startswith(prefix):
                total += len(key)
                if total > max_bytes:
                    return None
                keys.append(key)
        return keys

    async def write(self, batch: WriteBatch) -> None:
        if self.fail_writes:
            raise StoreUnavailable("memory store: simulated outage")
        for cond in batch.conditions:
            if not cond.holds(self._table(cond.table).get(cond.key)):
                raise StoreConflict(cond.table, cond.key)
        for table, key, value in batch.puts:
            self._table(table)[key] = value
        for table, key in batch.deletes:
            self._table(table).pop(key, None)
        self.writes += 1
        self._remember(batch.write_id)

    def _remember(self, write_id: bytes) -> None:
        self._landed.add(write_id)
        self._landed_order.append(write_id)
        if len(self._landed_order) > _LANDED_KEPT:
            self._landed.discard(self._landed_order.popleft())

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
