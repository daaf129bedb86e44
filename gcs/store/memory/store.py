"""In-process store: for tests and throwaway clusters (nothing survives the process).

There is no stored layout to migrate: every open starts empty, in the current layout.

It is also the reference implementation of :class:`~gcs.store.ha.HaStore` (unless built
with ``ha=False``, as ``memory://`` without ``--ha`` is: then no change stream is kept), and
the shared backend of in-process HA tests: :meth:`MemoryStore.handle` gives another *store object*
over the same data (as a second GCS process connected to the same Redis would have), with
its own fence and its own simulated outage.  Lease expiry follows the injected clock (a
``FakeClock`` in tests), which stands for the store's clock; so does the timeout of a
blocking :meth:`MemoryStore.read_changes`, which otherwise wakes on the next write.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gcs.base.clock import Clock, SystemClock, within
from gcs.store.base import Store, WriteBatch
from gcs.store.errors import StoreConflict, StoreUnavailable
from gcs.store.ha import Change, ChangeCursor, HaStore, LeaseInfo, StoreFenced
from gcs.store.ha_parts import (
    batch_changes,
    check_contiguous,
    check_fence_epoch,
    check_lease_args,
    counter_change,
    cursor_of,
    seq_of,
    whole_batches,
)

# How many recent write ids ``landed`` can answer for (memory stays bounded).
_LANDED_KEPT = 100_000
DEFAULT_MAX_CHANGES = 100_000
"""Batches the change stream keeps (older ones are trimmed: a follower that far behind
reloads)."""


@dataclass
class _Lease:
    holder: str
    epoch: int
    expires_s: float
    """On the clock's monotonic scale."""


@dataclass
class _Shared:
    """The data every handle of one memory store sees."""

    clock: Clock
    max_changes: int
    ha: bool
    tables: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    landed: set[bytes] = field(default_factory=set)
    landed_order: deque[bytes] = field(default_factory=deque)
    epoch: int = 0
    lease: _Lease | None = None
    seq: int = 0
    changes: deque[tuple[int, list[Change]]] = field(default_factory=deque)
    waiters: set[asyncio.Future[None]] = field(default_factory=set)

    def table(self, table: str) -> dict[bytes, bytes]:
        return self.tables.setdefault(table, {})

    def remember(self, write_id: bytes) -> None:
        self.landed.add(write_id)
        self.landed_order.append(write_id)
        if len(self.landed_order) > _LANDED_KEPT:
            self.landed.discard(self.landed_order.popleft())

    def append(self, changes: list[Change]) -> None:
        self.seq += 1
        self.changes.append((self.seq, changes))
        if len(self.changes) > self.max_changes:
            self.changes.popleft()
        waiters, self.waiters = self.waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def after(self, after: int, limit: int) -> list[tuple[int, list[Change]]]:
        """Up to ``limit`` retained batches after ``after`` (ChangesTrimmed if some are
        gone).  Walks the deque from its nearer end (a follower is usually near the tail)."""
        changes = self.changes
        oldest = changes[0][0] if changes else self.seq + 1
        start = min(max(after + 1 - oldest, 0), len(changes))
        if start < len(changes) // 2:
            retained = list(itertools.islice(changes, start, start + limit))
        else:
            tail = list(itertools.islice(reversed(changes), len(changes) - start))
            retained = tail[::-1][:limit]
        check_contiguous(after, self.seq, retained[0][0] if retained else None)
        return retained


class MemoryStore(Store, HaStore):
    """Dict-backed :class:`Store`.  ``fail_writes`` simulates an outage of this handle in
    tests (writes, increments and lease calls fail as unavailable; reads still work)."""

    def __init__(
        self,
        url: str = "memory://",
        *,
        clock: Clock | None = None,
        max_changes: int = DEFAULT_MAX_CHANGES,
        ha: bool = True,
    ) -> None:
        if max_changes < 1:
            raise ValueError(f"max_changes must be >= 1, got {max_changes}")
        self._attach(url, _Shared(clock or SystemClock(), max_changes, ha))

    def _attach(self, url: str, shared: _Shared) -> None:
        self.url = url
        self._shared = shared
        self._fence: int | None = None
        self.fail_writes = False
        self.writes = 0

    def handle(self) -> MemoryStore:
        """Another store object over the same data: its own fence, ``fail_writes`` and
        ``writes`` count (one per GCS in an in-process HA test)."""
        view = MemoryStore.__new__(MemoryStore)
        view._attach(self.url, self._shared)
        return view

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def get(self, table: str, key: bytes) -> bytes | None:
        return self._shared.table(table).get(key)

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        data = self._shared.table(table)
        return {k: data[k] for k in keys if k in data}

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return dict(self._shared.table(table))

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        return {k: v for k, v in self._shared.table(table).items() if k.startswith(prefix)}

    def _check_writable(self) -> None:
        if self.fail_writes:
            raise StoreUnavailable("memory store: simulated outage")
        if self._fence is not None and self._shared.epoch > self._fence:
            raise StoreFenced(self._fence, self._shared.epoch)

    async def scan_keys(self, table: str, prefix: bytes, *, max_bytes: int) -> list[bytes] | None:
        keys, total = [], 0
        for key in self._shared.table(table):
            if key.startswith(prefix):
                total += len(key)
                if total > max_bytes:
                    return None
                keys.append(key)
        return keys

    async def write(self, batch: WriteBatch) -> None:
        self._check_writable()
        shared = self._shared
        for cond in batch.conditions:
            if not cond.holds(shared.table(cond.table).get(cond.key)):
                raise StoreConflict(cond.table, cond.key)
        for table, key, value in batch.puts:
            shared.table(table)[key] = value
        for table, key in batch.deletes:
            shared.table(table).pop(key, None)
        self.writes += 1
        shared.remember(batch.write_id)
        if batch and shared.ha:
            shared.append(batch_changes(batch))

    async def landed(self, write_id: bytes) -> bool:
        return write_id in self._shared.landed

    async def increment(self, counter: str, by: int = 1) -> int:
        self._check_writable()
        if by < 1:
            raise ValueError("increment must be >= 1")
        counters = self._shared.counters
        counters[counter] = value = counters.get(counter, 0) + by
        if self._shared.ha:
            self._shared.append([counter_change(counter, value)])
        return value

    async def read_counter(self, counter: str) -> int:
        return self._shared.counters.get(counter, 0)

    # -- HaStore ---------------------------------------------------------------------------

    def _require_ha(self) -> None:
        if not self._shared.ha:
            raise RuntimeError("this MemoryStore was built with ha=False")

    def _lease_call(self) -> float:
        """A lease call may go ahead (no simulated outage): the clock's monotonic now."""
        self._require_ha()
        if self.fail_writes:
            raise StoreUnavailable("memory store: simulated outage")
        return self._shared.clock.monotonic_s()

    async def try_acquire_lease(self, holder: str, ttl_ms: int) -> int | None:
        check_lease_args(holder, ttl_ms)
        now = self._lease_call()
        shared = self._shared
        lease = shared.lease
        if lease is not None and lease.holder != holder and lease.expires_s > now:
            return None
        shared.epoch += 1
        shared.lease = _Lease(holder, shared.epoch, now + ttl_ms / 1000)
        return shared.epoch

    async def renew_lease(
        self, holder: str, epoch: int, ttl_ms: int, *, min_left_ms: int = 0
    ) -> bool:
        check_lease_args(holder, ttl_ms)
        now = self._lease_call()
        lease = self._shared.lease
        if lease is None or (lease.holder, lease.epoch) != (holder, epoch):
            return False
        if min_left_ms > 0 and (lease.expires_s - now) * 1000 < min_left_ms:
            return False
        lease.expires_s = now + ttl_ms / 1000  # even when lapsed: nobody took it since
        return True

    async def release_lease(self, holder: str, epoch: int) -> None:
        now = self._lease_call()
        lease = self._shared.lease
        if lease is not None and (lease.holder, lease.epoch) == (holder, epoch):
            lease.expires_s = min(lease.expires_s, now)

    async def read_lease(self) -> LeaseInfo | None:
        self._require_ha()
        lease = self._shared.lease
        if lease is None:
            return None
        remaining_s = lease.expires_s - self._shared.clock.monotonic_s()
        return LeaseInfo(lease.holder, lease.epoch, int(remaining_s * 1000))

    def fence(self, epoch: int) -> None:
        self._require_ha()
        self._fence = check_fence_epoch(epoch)

    async def change_cursor(self) -> ChangeCursor:
        self._require_ha()
        return cursor_of(self._shared.seq)

    async def read_changes(
        self, after: ChangeCursor, *, block_ms: int = 0, limit: int = 10_000
    ) -> tuple[ChangeCursor, list[Change]]:
        self._require_ha()
        shared = self._shared
        start = seq_of(after)
        retained = shared.after(start, limit)
        if not retained and block_ms > 0:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            shared.waiters.add(waiter)
            try:
                with contextlib.suppress(TimeoutError):
                    await within(shared.clock, block_ms / 1000, waiter)
            finally:
                shared.waiters.discard(waiter)
            retained = shared.after(start, limit)
        return whole_batches(retained, start, limit)
