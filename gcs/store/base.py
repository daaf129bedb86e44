"""The one async storage interface every manager uses.

Model: named tables of ``key (bytes) -> value (bytes)`` plus named monotonic counters.
Managers keep the authoritative copy in memory and write through; the store is what makes a
write durable.  A write is acknowledged to a client only after :meth:`Store.write` returned.

Atomicity: one :class:`WriteBatch` is applied all-or-nothing, including its conditions
(compare-and-set on the current value of a key).  Counters are separate, durable and never
go backwards (``INCR`` semantics).
"""

from __future__ import annotations

import abc
import enum
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

__all__ = ["META_CLUSTER_ID", "META_SESSION_NAME", "PRESENT", "Condition", "Store", "WriteBatch"]

# Table names used by the managers.  The Redis backend lays them out as Ray does
# (``RAY<namespace>@<TABLE>`` hashes) so NODE/JOB/KV are readable with Ray's tooling.
TABLE_NODE = "NODE"
TABLE_JOB = "JOB"
TABLE_KV = "KV"
TABLE_PLACEMENT_GROUP = "PLACEMENT_GROUP"
TABLE_VIRTUAL_CLUSTER = "VIRTUAL_CLUSTER"
TABLE_WORKERS = "WORKERS"
TABLE_META = "GCS_META"

# The GCS's own records in TABLE_META (never in TABLE_KV, which clients write through
# InternalKV).  Clients still see published copies in KV where Ray's clients read them.
META_CLUSTER_ID = b"cluster/ray_cluster_id"
META_SESSION_NAME = b"cluster/session_name"


class _Present(enum.Enum):
    PRESENT = "present"


PRESENT: Final = _Present.PRESENT
"""``Condition.expected`` value meaning "the key exists, whatever its value"."""


@dataclass(frozen=True, slots=True)
class Condition:
    """Require ``table[key]`` to equal ``expected`` (``None``: the key must be absent;
    :data:`PRESENT`: it must exist with any value)."""

    table: str
    key: bytes
    expected: bytes | _Present | None

    def holds(self, current: bytes | None) -> bool:
        """Whether the condition is met when the key's value is ``current``."""
        if self.expected is PRESENT:
            return current is not None
        return current == self.expected


@dataclass(slots=True)
class WriteBatch:
    """Puts and deletes applied atomically, guarded by optional conditions.

    Conditions are checked in order, all before any write, in the same atomic step: a
    leader's lease-epoch guard (fencing) is a condition placed first
    (``gcs.store.redis.scripts``).

    ``write_id`` (16 random bytes) names the batch so an ambiguous failure can be resolved
    with :meth:`Store.landed`.
    """

    puts: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    deletes: list[tuple[str, bytes]] = field(default_factory=list)
    conditions: list[Condition] = field(default_factory=list)
    write_id: bytes = field(default_factory=lambda: os.urandom(16))

    def put(self, table: str, key: bytes, value: bytes) -> WriteBatch:
        self.puts.append((table, key, value))
        return self

    def delete(self, table: str, key: bytes) -> WriteBatch:
        self.deletes.append((table, key))
        return self

    def expect(self, table: str, key: bytes, expected: bytes | None) -> WriteBatch:
        self.conditions.append(Condition(table, key, expected))
        return self

    def expect_present(self, table: str, key: bytes) -> WriteBatch:
        """Require the key to exist (any value): "delete and count it" without a read."""
        self.conditions.append(Condition(table, key, PRESENT))
        return self

    def __bool__(self) -> bool:
        return bool(self.puts or self.deletes)


T = TypeVar("T")


class Store(abc.ABC):
    """Async key-value tables + counters.  Every method may raise :class:`StoreError`."""

    url: str

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect (and migrate the schema, for SQL).  Idempotent."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections.  Idempotent; safe before :meth:`open`."""

    @abc.abstractmethod
    async def get(self, table: str, key: bytes) -> bytes | None: ...

    @abc.abstractmethod
    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        """Values of the keys that exist (missing keys are absent from the result)."""

    @abc.abstractmethod
    async def get_all(self, table: str) -> dict[bytes, bytes]: ...

    @abc.abstractmethod
    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]: ...

    async def scan_keys(self, table: str, prefix: bytes, *, max_bytes: int) -> list[bytes] | None:
        """The keys starting with ``prefix`` (values not read), or None as soon as they add
        up to more than ``max_bytes``: a listing that could not be answered is not built.
        Backends override this to read keys only and stop early; this fallback reads the
        values too."""
        keys, total = [], 0
        for key in await self.scan_prefix(table, prefix):
            total += len(key)
            if total > max_bytes:
                return None
            keys.append(key)
        return keys

    def decoded_rows(self, table: str) -> Mapping[bytes, Any] | None:
        """Every row of ``table`` already parsed (the messages are the caller's from then
        on), when this store holds them ready -- a hot standby's warm copy at a takeover
        (``gcs.server.ha_mirror``) -- else None: read ``get_all`` and parse."""
        return None

    def prepared(
        self, table: str, view: Callable[[Any], T], rows: Iterable[tuple[bytes, Any]]
    ) -> dict[bytes, T]:
        """``view(row)`` by key, for ``(key, row)`` pairs of ``table`` as :meth:`decoded_rows`
        gave them.  A hot standby builds the views it knows (``gcs.server.ha_mirror.PREPARED``)
        as its rows arrive; at a takeover they are handed over (the caller owns them: ask
        once per row), each only if built from exactly that row object, instead of building
        10,000 again.  Elsewhere ``view`` is called on each row."""
        return {key: view(row) for key, row in rows}

    @abc.abstractmethod
    async def write(self, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically.

        Raises StoreConflict if a condition fails, StoreUnavailable only when the batch
        certainly did not land, and StoreOutcomeUnknown when it may have.
        """

    async def landed(self, write_id: bytes) -> bool:
        """Whether the batch ``write_id`` was applied.  Raises StoreUnavailable while the
        backend cannot tell yet.  Backends that can fail ambiguously must override this.

        A False answer is final: the backend fences the id, so a copy of the batch still in
        flight (a retried request sitting in a socket buffer) can no longer land.  Answers
        are kept for a bounded time after the write (backend option, minutes)."""
        raise NotImplementedError(f"{type(self).__name__} cannot resolve write ids")

    @abc.abstractmethod
    async def increment(self, counter: str, by: int = 1) -> int:
        """Add ``by`` (>= 1) to a durable counter starting at 0; return the new value."""

    @abc.abstractmethod
    async def read_counter(self, counter: str) -> int:
        """Current value (0 if never incremented)."""

    async def put(self, table: str, key: bytes, value: bytes) -> None:
        await self.write(WriteBatch().put(table, key, value))

    async def delete(self, table: str, key: bytes) -> None:
        await self.write(WriteBatch().delete(table, key))

    async def put_many(self, table: str, items: Mapping[bytes, bytes]) -> None:
        batch = WriteBatch()
        for key, value in items.items():
            batch.put(table, key, value)
        await self.write(batch)

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
