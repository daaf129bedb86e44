"""The HA side of :class:`~gcs.store.sql.store.SqlStore` (``gcs.store.ha``): the fence,
the lease row and the change stream, each in the write's own transaction (the design: the
store module's docstring).  A mixin over the store's connection helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from sqlalchemy import delete, exc, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from gcs.base.background import race
from gcs.base.clock import Clock
from gcs.store.base import WriteBatch
from gcs.store.errors import StoreCorrupt, StoreUnavailable
from gcs.store.ha import Change, ChangeCursor, LeaseInfo, StoreFenced
from gcs.store.ha_parts import (
    check_contiguous,
    check_fence_epoch,
    check_lease_args,
    cursor_of,
    decode_changes,
    encode_batch,
    seq_of,
    whole_batches,
)
from gcs.store.sql.ha import CHANNEL, LeaseStatements, PgNotifications
from gcs.store.sql.options import SqlOptions
from gcs.store.sql.schema import CHANGES, LEASE

__all__ = ["SqlHaStream", "now_ms"]


# One round trip for an HA batch on PostgreSQL: the write id, the lease row's lock and the
# batch's stream number (the fence is checked on the epoch it returns), the stream row and
# its notification (sent at COMMIT; a rolled-back batch sends none).  The row with the
# number is the statement's result, so the data-modifying CTEs run after the row is locked.
_PG_HA_BATCH = text(
    "WITH w AS (INSERT INTO gcs_writes (namespace, write_id, at_ms, landed) "
    "VALUES (:ns, :wid, :at, true)), "
    "l AS (UPDATE gcs_lease SET seq = seq + :n WHERE namespace = :ns RETURNING epoch, seq), "
    "c AS (INSERT INTO gcs_changes (namespace, seq, at_ms, changes) "
    "SELECT :ns, seq, :at, :blob FROM l WHERE :n > 0) "
    "SELECT epoch, seq, CASE WHEN :n > 0 THEN pg_notify(:ch, :ns) END FROM l"
)
_CHANGES_READ = 1000
"""Stream rows (batches) one read asks for at most."""
_LISTEN_RECHECK_S = 5.0
"""A reader waiting for a notification reads again at least this often."""


def now_ms(clock: Clock) -> int:
    """``clock``'s wall time in milliseconds (the stamps of write ids and stream rows)."""
    return int(clock.now_s() * 1000)


class SqlHaStream:
    """Lease, fence and change stream of a SQL store (mixed into ``SqlStore``)."""

    if TYPE_CHECKING:
        namespace: str
        _safe_url: str
        _dialect: str
        _options: SqlOptions
        _clock: Clock
        _ha: bool
        _fence: int
        _lease: LeaseStatements
        _notifications: PgNotifications | None

        def _read(self) -> AbstractAsyncContextManager[AsyncConnection]: ...

        def _write(
            self, commit: Callable[[AsyncConnection], Awaitable[None]] | None = None
        ) -> AbstractAsyncContextManager[AsyncConnection]: ...

        def _fenced(self, write_id: bytes) -> StoreUnavailable: ...

    def _require_ha(self) -> None:
        if not self._ha:
            raise RuntimeError("this SqlStore was built without ha=True (gcs serve --ha)")

    def _check_fence(self, fence: int, current: int) -> None:
        if fence and current > fence:
            raise StoreFenced(fence, current)

    async def _ha_claim(self, conn: AsyncConnection, batches: int) -> int:
        """Lock the lease row, check the fence, take ``batches`` (0 or 1) stream numbers:
        the last one taken."""
        fence = self._fence
        row = (await conn.execute(self._lease.claim(batches))).first()
        if row is None:
            raise StoreCorrupt(f"{self._safe_url}: no lease row for namespace {self.namespace!r}")
        self._check_fence(fence, int(row[0]))
        return int(row[1])

    async def _ha_append(self, conn: AsyncConnection, seq: int, changes: bytes) -> None:
        """The stream row of batch ``seq`` (and its notification), in the write's
        transaction; trims now and then."""
        await conn.execute(
            CHANGES.insert().values(
                namespace=self.namespace, seq=seq, at_ms=now_ms(self._clock), changes=changes
            )
        )
        if self._dialect == "postgresql":
            await conn.execute(
                text("SELECT pg_notify(:ch, :ns)"), {"ch": CHANNEL, "ns": self.namespace}
            )
        await self._ha_trim(conn, seq)

    async def _ha_batch(self, conn: AsyncConnection, batch: WriteBatch) -> None:
        if self._dialect != "postgresql":
            seq = await self._ha_claim(conn, 1 if batch else 0)
            if batch:
                await self._ha_append(conn, seq, encode_batch(batch))
            return
        fence, n = self._fence, 1 if batch else 0
        try:
            row = (
                await conn.execute(
                    _PG_HA_BATCH,
                    {
                        "ns": self.namespace,
                        "wid": batch.write_id,
                        "at": now_ms(self._clock),
                        "n": n,
                        "blob": encode_batch(batch),
                        "ch": CHANNEL,
                    },
                )
            ).first()
        except exc.IntegrityError as err:
            raise self._fenced(batch.write_id) from err
        if row is None:
            raise StoreCorrupt(f"{self._safe_url}: no lease row for namespace {self.namespace!r}")
        self._check_fence(fence, int(row[0]))
        if n:
            await self._ha_trim(conn, int(row[1]))

    async def _ha_trim(self, conn: AsyncConnection, seq: int) -> None:
        """Every ``changes_trim_every`` batches: drop what is past the count bound, and
        aged rows among the oldest few (bounded work: an index range, never a scan)."""
        opts = self._options
        if seq % opts.changes_trim_every:
            return
        mine = CHANGES.c.namespace == self.namespace
        oldest = (
            select(CHANGES.c.seq, CHANGES.c.at_ms)
            .where(mine)
            .order_by(CHANGES.c.seq)
            .limit(4 * opts.changes_trim_every)
            .subquery()
        )
        old = now_ms(self._clock) - int(opts.changes_max_age_s * 1000)
        aged = await conn.execute(select(func.max(oldest.c.seq)).where(oldest.c.at_ms < old))
        cut = max(seq - opts.changes_max_entries, aged.scalar_one_or_none() or 0)
        if cut > 0:  # a prefix, so a reader behind it always sees the gap
            await conn.execute(delete(CHANGES).where(mine, CHANGES.c.seq <= cut))

    async def try_acquire_lease(self, holder: str, ttl_ms: int) -> int | None:
        self._require_ha()
        check_lease_args(holder, ttl_ms)
        async with self._write() as conn:
            row = (await conn.execute(self._lease.acquire(holder, ttl_ms))).first()
        return int(row[0]) if row is not None else None

    async def renew_lease(
        self, holder: str, epoch: int, ttl_ms: int, *, min_left_ms: int = 0
    ) -> bool:
        self._require_ha()
        check_lease_args(holder, ttl_ms)
        async with self._write() as conn:
            result = await conn.execute(self._lease.renew(holder, epoch, ttl_ms, min_left_ms))
        return bool(result.rowcount)

    async def release_lease(self, holder: str, epoch: int) -> None:
        self._require_ha()
        async with self._write() as conn:
            await conn.execute(self._lease.release(holder, epoch))

    async def read_lease(self) -> LeaseInfo | None:
        self._require_ha()
        async with self._read() as conn:
            row = (await conn.execute(self._lease.read())).first()
        if row is None or not row[1]:
            return None
        return LeaseInfo(str(row[0]), int(row[1]), int(row[2]))

    def fence(self, epoch: int) -> None:
        self._require_ha()
        self._fence = check_fence_epoch(epoch)

    async def change_cursor(self) -> ChangeCursor:
        self._require_ha()
        async with self._read() as conn:
            return cursor_of(await self._last_seq(conn))

    async def _last_seq(self, conn: AsyncConnection) -> int:
        row = await conn.execute(select(LEASE.c.seq).where(LEASE.c.namespace == self.namespace))
        return int(row.scalar_one_or_none() or 0)

    async def read_changes(
        self, after: ChangeCursor, *, block_ms: int = 0, limit: int = 10_000
    ) -> tuple[ChangeCursor, list[Change]]:
        self._require_ha()
        start = seq_of(after)
        deadline = self._clock.monotonic_s() + block_ms / 1000
        notifications = self._notifications
        while True:
            remaining_s = deadline - self._clock.monotonic_s()
            listening = (
                remaining_s > 0 and notifications is not None and await notifications.ready()
            )
            waiter = notifications.watch() if listening and notifications else None
            try:
                found = await self._changes_after(start, limit)
                if found is not None or remaining_s <= 0:
                    return found or (after, [])
                if waiter is not None:
                    # bounded: a LISTEN connection that died unseen costs seconds, not the wait
                    await self._wait(waiter, min(remaining_s, _LISTEN_RECHECK_S))
                else:
                    await self._clock.sleep(min(self._options.changes_poll_interval_s, remaining_s))
            finally:
                if waiter is not None and notifications is not None:
                    notifications.unwatch(waiter)

    async def _changes_after(
        self, start: int, limit: int
    ) -> tuple[ChangeCursor, list[Change]] | None:
        """Whole batches after ``start``; None when there are none yet."""
        async with self._read() as conn:
            # the last number first: batches up to it have committed, so a gap after
            # ``start`` in what the second statement sees is a trim, never a late commit
            last = await self._last_seq(conn)
            rows = await conn.execute(
                select(CHANGES.c.seq, CHANGES.c.changes)
                .where(CHANGES.c.namespace == self.namespace, CHANGES.c.seq > start)
                .order_by(CHANGES.c.seq)
                .limit(min(limit, _CHANGES_READ))
            )
            try:
                batches = [(int(seq), decode_changes(bytes(blob))) for seq, blob in rows]
            except ValueError as err:
                raise StoreCorrupt(f"{self._safe_url}: undecodable change row: {err}") from err
        check_contiguous(start, last, batches[0][0] if batches else None)
        return whole_batches(batches, start, limit) if batches else None

    async def _wait(self, waiter: asyncio.Future[None], timeout_s: float) -> None:
        """Until ``waiter`` completes or ``timeout_s`` of the store's clock passed."""
        await race(asyncio.shield(waiter), self._clock.sleep(timeout_s))
