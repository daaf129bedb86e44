"""A toy store backend, the whole of what adding one takes: this module and the one row
:data:`TOY` (registered where a test wants it: ``STORES.registered(TOY)``).

Dict-backed: every (URL, namespace) keeps its tables in this process, so a store reopened
on a URL sees what an earlier one wrote (the contract suite's durability tests run on it
too).  It records what was done with it (``opened``, ``closed``, ``writes``)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gcs.store.base import Store, WriteBatch
from gcs.store.errors import StoreConflict, StoreUnavailable
from gcs.store.registry import StoreKind, TestInstance
from gcs.store.settings import StoreSettings


@dataclass
class _Shelf:
    tables: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    write_ids: set[bytes] = field(default_factory=set)


_SHELVES: dict[tuple[str, str], _Shelf] = {}


class ToyStore(Store):
    def __init__(self, url: str, settings: StoreSettings) -> None:
        self.url = url
        self.namespace = settings.namespace
        self._shelf = _SHELVES.setdefault((url, settings.namespace), _Shelf())
        self.opened = self.closed = False
        self.writes = 0

    async def open(self) -> None:
        self.opened, self.closed = True, False

    async def close(self) -> None:
        self.closed = True

    def _table(self, table: str) -> dict[bytes, bytes]:
        if not self.opened or self.closed:
            raise StoreUnavailable(f"{self.url}: not open")
        return self._shelf.tables.setdefault(table, {})

    async def get(self, table: str, key: bytes) -> bytes | None:
        return self._table(table).get(key)

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        rows = self._table(table)
        return {key: rows[key] for key in keys if key in rows}

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return dict(self._table(table))

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        return {k: v for k, v in self._table(table).items() if k.startswith(prefix)}

    async def write(self, batch: WriteBatch) -> None:
        for cond in batch.conditions:
            if not cond.holds(self._table(cond.table).get(cond.key)):
                raise StoreConflict(cond.table, cond.key)
        for table, key, value in batch.puts:
            self._table(table)[key] = value
        for table, key in batch.deletes:
            self._table(table).pop(key, None)
        self._shelf.write_ids.add(batch.write_id)
        self.writes += 1

    async def landed(self, write_id: bytes) -> bool:
        return write_id in self._shelf.write_ids

    async def increment(self, counter: str, by: int = 1) -> int:
        if by < 1:
            raise ValueError("increment must be >= 1")
        self._table("")  # open?
        value = self._shelf.counters.get(counter, 0) + by
        self._shelf.counters[counter] = value
        return value

    async def read_counter(self, counter: str) -> int:
        self._table("")
        return self._shelf.counters.get(counter, 0)


def _toy_url(_server: Any, folder: pathlib.Path) -> str:
    return f"toy://{folder.name}"


TOY = StoreKind(
    name="toy",
    schemes=("toy",),
    factory=ToyStore,
    ha=False,
    tests=(TestInstance("toy", _toy_url),),
)
"""The one row."""
