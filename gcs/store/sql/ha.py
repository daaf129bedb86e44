"""The SQL side of ``gcs.store.ha``: the database's clock, the lease statements, and the
PostgreSQL ``LISTEN`` that wakes a blocked change reader.

Layout (revision 0004, ``gcs.store.sql.schema``): ``gcs_lease`` (one row per namespace)
and ``gcs_changes`` (one row per applied batch).  How the store uses them is in
``gcs.store.sql``'s docstring.  The statements here are plain SQLAlchemy Core; only the
clock differs between the dialects.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from sqlalchemy import ColumnElement, literal_column, select, update
from sqlalchemy.sql.dml import ReturningUpdate, Update

from gcs.base.clock import Clock
from gcs.store.sql.schema import LEASE

__all__ = ["CHANNEL", "LeaseStatements", "PgNotifications"]

log = structlog.get_logger("gcs.store.sql")

_RETRY_S = 5.0
"""After a failed LISTEN connection, poll this long before trying again."""

CHANNEL = "gcs_changes"
"""PostgreSQL ``NOTIFY`` channel of every namespace; the payload is the namespace."""

_NOW_MS = {
    # clock_timestamp(), not now(): now() is the transaction's start, and a lease
    # statement may wait on the row lock for a while.
    "postgresql": "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
}


class LeaseStatements:
    """The lease as SQL for one namespace, judged on the database's clock."""

    def __init__(self, dialect: str, namespace: str) -> None:
        self._now: ColumnElement[int] = literal_column(_NOW_MS[dialect])
        self._row = LEASE.c.namespace == namespace

    def acquire(self, holder: str, ttl_ms: int) -> ReturningUpdate[int]:
        """The new epoch (one row) when the lease is free, lapsed or ``holder``'s."""
        free = (LEASE.c.holder == holder) | (LEASE.c.expires_ms <= self._now)
        return (
            update(LEASE)
            .where(self._row, free)
            .values(epoch=LEASE.c.epoch + 1, holder=holder, expires_ms=self._now + ttl_ms)
            .returning(LEASE.c.epoch)
        )

    def renew(self, holder: str, epoch: int, ttl_ms: int, min_left_ms: int = 0) -> Update:
        """One row updated when ``(holder, epoch)`` is still the last grant (with at least
        ``min_left_ms`` left, when > 0)."""
        where = [self._row, LEASE.c.holder == holder, LEASE.c.epoch == epoch]
        if min_left_ms > 0:
            where.append(LEASE.c.expires_ms - self._now >= min_left_ms)
        return update(LEASE).where(*where).values(expires_ms=self._now + ttl_ms)

    def release(self, holder: str, epoch: int) -> Update:
        return (
            update(LEASE)
            .where(
                self._row,
                LEASE.c.holder == holder,
                LEASE.c.epoch == epoch,
                LEASE.c.expires_ms > self._now,
            )
            .values(expires_ms=self._now)
        )

    def read(self) -> Any:
        """holder, epoch, remaining ms."""
        return select(LEASE.c.holder, LEASE.c.epoch, LEASE.c.expires_ms - self._now).where(
            self._row
        )

    def claim(self, batches: int) -> ReturningUpdate[int, int]:
        """Lock the row for this write transaction and take the next ``batches`` (0 or 1)
        stream numbers: the current epoch (to compare with the fence) and the last number."""
        return (
            update(LEASE)
            .where(self._row)
            .values(seq=LEASE.c.seq + batches)
            .returning(LEASE.c.epoch, LEASE.c.seq)
        )


class PgNotifications:
    """One ``LISTEN gcs_changes`` connection (asyncpg, outside the pool) that wakes the
    store's blocked change readers when a batch of its namespace commits.

    Opened on the first blocking read.  When it cannot connect or its connection dies,
    :meth:`wait` says so (returns False at once) and the reader polls instead; the next
    wait tries to connect again."""

    def __init__(self, dsn: str, namespace: str, connect_timeout_s: float, clock: Clock) -> None:
        self._dsn = dsn
        self._clock = clock
        self._namespace = namespace
        self._connect_timeout_s = connect_timeout_s
        self._conn: Any = None
        self._waiters: set[asyncio.Future[None]] = set()
        self._lock = asyncio.Lock()
        self._retry_at = 0.0

    async def _listening(self) -> bool:
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return True
            if self._clock.monotonic_s() < self._retry_at:
                return False
            import asyncpg

            try:
                conn = await asyncpg.connect(self._dsn, timeout=self._connect_timeout_s)
                await conn.add_listener(CHANNEL, self._notified)
            except (TimeoutError, OSError, asyncpg.PostgresError) as err:
                self._retry_at = self._clock.monotonic_s() + _RETRY_S
                log.warning("sql_changes_listen_failed", error=str(err), fallback="polling")
                return False
            conn.add_termination_listener(self._terminated)
            self._conn = conn
            return True

    def watch(self) -> asyncio.Future[None]:
        """A future that completes on the next notification (register before reading, so
        a commit between the read and the wait is not missed)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        return waiter

    def unwatch(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    async def ready(self) -> bool:
        """Whether notifications will arrive (False: poll)."""
        return await self._listening()

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload != self._namespace:
            return
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _terminated(self, _conn: Any) -> None:
        self._conn = None
        self._notified(None, 0, CHANNEL, self._namespace)  # wake readers: they re-check

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close(timeout=self._connect_timeout_s)
