"""SQL backend: SQLite (aiosqlite) and PostgreSQL (asyncpg) through one SQLAlchemy 2 async code.

Schema (Alembic, ``migrations/``): ``gcs_kv(namespace, table_name, key, value)`` and
``gcs_counters(namespace, name, value)``.  ``open()`` upgrades the schema to head.

Atomicity and conditions:

* A :class:`WriteBatch` is one transaction; its conditions are read inside it.
* SQLite serialises writers: write transactions start with ``BEGIN IMMEDIATE`` so the
  conditions are read under the database write lock (plus an in-process asyncio lock so our own
  writers queue on the loop instead of spinning on ``busy_timeout``).  WAL mode and
  ``synchronous=FULL``: a committed (acknowledged) write survives ``kill -9`` and power loss.
* PostgreSQL: before reading conditions, a write takes transaction-scoped advisory locks on a
  64-bit hash of every key it reads or writes, in sorted order.  Row locks (``FOR UPDATE``)
  cannot lock a key that does not exist yet ("expect absent"); advisory locks can, so two
  concurrent compare-and-sets on one key serialise and exactly one wins.  A hash collision only
  serialises two unrelated writes.

Errors are translated at this boundary (never a SQLAlchemy / driver exception out):
connection failures, timeouts and "database is locked" → :class:`StoreUnavailable`; schema
trouble → :class:`StoreCorrupt`; anything else from the database → :class:`StoreError`.

Definite answers (write ids): every batch inserts its ``write_id`` into ``gcs_writes`` in its
own transaction (PostgreSQL: in the statement that takes the key locks, so no extra round
trip).  A failure before COMMIT was sent cannot have landed → StoreUnavailable.  A
failure *during* COMMIT (connection dropped, I/O error after fsync) is ambiguous: ``write``
then asks :meth:`SqlStore.landed` a few times (bounded) and returns normally if the row is
there, raises StoreUnavailable if not, StoreOutcomeUnknown if the database stays away.
``landed`` fences: it inserts a ``landed = false`` row for an unknown id in a write
transaction, so a commit still in flight (PostgreSQL: it waits on the primary key) either
came first (answer True) or can no longer succeed (answer False, final).  Rows older than
``SqlOptions.write_id_retention_s`` are pruned now and then inside a write transaction.

High availability (``SqlStore(ha=True)``, ``gcs serve --ha``; the contract is
``gcs.store.ha``; PostgreSQL in production, SQLite for tests): the namespace's row in
``gcs_lease`` holds the last epoch granted (only ever incremented), its holder, its expiry
on the database's clock, and ``seq``, the number of the last change-stream batch.  Every
HA write transaction starts by updating that row (``seq = seq + 1``, or ``+ 0`` for a batch
without puts or deletes) ``RETURNING epoch, seq``: the update takes the row lock (held to
COMMIT), so

* **fencing** is checked inside the write's own transaction: an acquisition (an update of
  the same row) either commits before the write's update, which then sees the new epoch and
  refuses (StoreFenced, rolled back), or waits until the write committed;
* the **change stream** is gap-free and in commit order: ``seq`` is a transactional counter
  (a refused or rolled-back batch takes no number, unlike a sequence), and batches of one
  namespace commit one at a time.  Each applied batch inserts its row into ``gcs_changes``
  in the same transaction; on PostgreSQL the insert, the write id and the lock are one
  statement with ``pg_notify`` (delivered at COMMIT), so an HA write costs no extra round
  trip.  The per-key advisory locks are not taken then: the row lock already serialises
  every HA write of the namespace.
* ``read_changes(block_ms)`` waits for a ``NOTIFY`` on a dedicated ``LISTEN`` connection
  (``gcs.store.sql_ha``), polling when that is not possible (SQLite, a lost connection).
* The stream is trimmed by count and age every ``changes_trim_every`` batches, always a
  prefix, so a reader behind the trim sees the gap (ChangesTrimmed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import pathlib
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from alembic.util.exc import CommandError
from sqlalchemy import bindparam, delete, event, exc, func, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from gcs.clock import SYSTEM_CLOCK, Clock, within
from gcs.store import migrate
from gcs.store.base import Condition, Store, WriteBatch
from gcs.store.errors import (
    StoreConflict,
    StoreCorrupt,
    StoreError,
    StoreFull,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from gcs.store.ha import Change, ChangeCursor, HaStore, LeaseInfo, StoreFenced
from gcs.store.ha_parts import (
    check_contiguous,
    check_fence_epoch,
    check_lease_args,
    counter_change,
    cursor_of,
    decode_changes,
    encode_batch,
    encode_changes,
    seq_of,
    whole_batches,
)
from gcs.store.sql_ha import CHANNEL, LeaseStatements, PgNotifications
from gcs.store.sql_schema import CHANGES, COUNTERS, KV, LEASE, WRITES
from gcs.store.sql_url import normalize_sql_url

__all__ = ["SqlOptions", "SqlStore"]

# Execution option that marks a connection's transaction as a writer (SQLite: BEGIN IMMEDIATE).
_WRITE_OPTION = "gcs_write"
# Advisory lock key serialising concurrent schema upgrades on PostgreSQL ("gcs_migr").
_MIGRATION_LOCK_KEY = 0x6763735F6D696772
# Keep IN (...) lists well under every driver's bind-parameter limit.
_IN_CHUNK = 500


@dataclass(frozen=True, slots=True)
class SqlOptions:
    """Connection tuning; defaults suit a GCS next to its database."""

    connect_timeout_s: float = 5.0
    """Give up connecting (PostgreSQL) after this long → StoreUnavailable."""
    command_timeout_s: float = 10.0
    """Give up on one statement (PostgreSQL) after this long → StoreUnavailable."""
    busy_timeout_s: float = 5.0
    """SQLite: wait this long for another process's write lock → StoreUnavailable."""
    pool_size: int = 5
    """Connections kept open (PostgreSQL)."""
    write_id_retention_s: float = 900.0
    """How long ``landed()`` can answer for a write id (rows pruned after this)."""
    prune_every: int = 512
    """Prune expired write ids in every n-th write transaction."""
    resolve_attempts: int = 3
    """After an ambiguous commit, ask ``landed()`` this many times before giving up."""
    resolve_backoff_s: float = 0.2
    """Wait between those attempts (doubling)."""
    changes_max_entries: int = 100_000
    """HA: batches the change stream keeps (a standby further behind reloads)."""
    changes_max_age_s: float = 3600.0
    """HA: batches older than this are trimmed too."""
    changes_trim_every: int = 256
    """HA: trim the change stream in every n-th batch's transaction."""
    changes_poll_interval_s: float = 0.05
    """HA: how often a blocked ``read_changes`` looks again when it cannot be notified
    (SQLite, or PostgreSQL while its LISTEN connection is down)."""

    default: ClassVar[SqlOptions]


SqlOptions.default = SqlOptions()


class SqlStore(Store, HaStore):
    """:class:`Store` over SQLite or PostgreSQL.  Build with a URL, then ``await open()``."""

    clock: Clock = SYSTEM_CLOCK  # retry back-off and change-stream waits (tests set a fake)

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "default",
        options: SqlOptions = SqlOptions.default,
        ha: bool = False,
    ) -> None:
        self.url = url
        self.namespace = namespace
        self._driver_url = normalize_sql_url(url)
        parsed = make_url(self._driver_url)
        self._dialect = parsed.get_backend_name()
        self._safe_url = parsed.render_as_string(hide_password=True)
        self._options = options
        self._engine: AsyncEngine | None = None
        # SQLite allows one writer; queue ours on the loop rather than in busy_timeout.
        self._write_lock = asyncio.Lock() if self._dialect == "sqlite" else None
        self._writes_since_prune = 0
        self._ha = ha
        self._fence = 0
        self._lease = LeaseStatements(self._dialect, namespace)
        self._notifications: PgNotifications | None = None
        if ha and self._dialect == "postgresql":
            dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
            self._notifications = PgNotifications(dsn, namespace, options.connect_timeout_s)

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if self._engine is not None:
            return
        async with self._translate("open"):
            engine = self._create_engine()
        try:
            async with self._translate("migrate"), self._transaction(engine, write=True) as conn:
                if self._dialect == "postgresql":
                    await conn.execute(
                        text("SELECT pg_advisory_xact_lock(:k)"),
                        {"k": _signed64(_MIGRATION_LOCK_KEY)},
                    )
                await conn.run_sync(_upgrade_if_behind)
                if self._ha:
                    await conn.execute(
                        _insert_for(self._dialect)(LEASE)
                        .values(namespace=self.namespace, holder="", epoch=0, expires_ms=0, seq=0)
                        .on_conflict_do_nothing(index_elements=[LEASE.c.namespace])
                    )
        except BaseException:
            await engine.dispose()
            raise
        self._engine = engine

    async def schema_revision(self) -> str | None:
        """Alembic revision the database is at (``head_revision()`` after ``open()``)."""
        async with self._read() as conn:
            return await conn.run_sync(migrate.current_revision)

    async def close(self) -> None:
        if self._notifications is not None:
            await self._notifications.close()
        engine, self._engine = self._engine, None
        if engine is not None:
            with contextlib.suppress(exc.SQLAlchemyError, OSError):
                await engine.dispose()

    def _create_engine(self) -> AsyncEngine:
        opts = self._options
        if self._dialect == "sqlite":
            database = make_url(self._driver_url).database
            if database and database != ":memory:":
                pathlib.Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            engine = create_async_engine(
                self._driver_url,
                connect_args={"timeout": opts.busy_timeout_s},
                # Every use ends its transaction; the reset hook below rolls back only a
                # connection that did not (saves a driver-thread round trip per call).
                pool_reset_on_return=None,
            )
            _install_sqlite_hooks(engine, busy_timeout_ms=int(opts.busy_timeout_s * 1000))
            return engine
        return create_async_engine(
            self._driver_url,
            pool_pre_ping=True,  # replace connections that died in an outage before use
            pool_size=opts.pool_size,
            pool_timeout=opts.command_timeout_s,
            connect_args={
                "timeout": opts.connect_timeout_s,
                "command_timeout": opts.command_timeout_s,
                "server_settings": {"application_name": "gcs"},
            },
        )

    # -- reads ---------------------------------------------------------------------------------

    async def get(self, table: str, key: bytes) -> bytes | None:
        async with self._read() as conn:
            row = await conn.execute(
                select(KV.c.value).where(*self._in_table(table), KV.c.key == key)
            )
            return row.scalar_one_or_none()

    async def multi_get(self, table: str, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        async with self._read() as conn:
            return await self._select_keys(conn, table, wanted)

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        async with self._read() as conn:
            rows = await conn.execute(select(KV.c.key, KV.c.value).where(*self._in_table(table)))
            return {bytes(k): bytes(v) for k, v in rows}

    async def scan_prefix(self, table: str, prefix: bytes) -> dict[bytes, bytes]:
        where = [*self._in_table(table), KV.c.key >= prefix]
        upper = _prefix_upper_bound(prefix)
        if upper is not None:
            where.append(KV.c.key < upper)
        async with self._read() as conn:
            rows = await conn.execute(select(KV.c.key, KV.c.value).where(*where))
            return {bytes(k): bytes(v) for k, v in rows if bytes(k).startswith(prefix)}

    async def scan_keys(self, table: str, prefix: bytes, *, max_bytes: int) -> list[bytes] | None:
        where = [*self._in_table(table), KV.c.key >= prefix]
        upper = _prefix_upper_bound(prefix)
        if upper is not None:
            where.append(KV.c.key < upper)
        keys: list[bytes] = []
        total = 0
        async with self._read() as conn:
            rows = await conn.stream(select(KV.c.key).where(*where))
            async for (raw,) in rows:
                key = bytes(raw)
                if not key.startswith(prefix):
                    continue
                total += len(key)
                if total > max_bytes:
                    await rows.close()
                    return None
                keys.append(key)
        return keys

    async def read_counter(self, counter: str) -> int:
        async with self._read() as conn:
            row = await conn.execute(
                select(COUNTERS.c.value).where(
                    COUNTERS.c.namespace == self.namespace, COUNTERS.c.name == counter
                )
            )
            value = row.scalar_one_or_none()
            return int(value) if value is not None else 0

    # -- writes --------------------------------------------------------------------------------

    async def write(self, batch: WriteBatch) -> None:
        if not batch and not batch.conditions:
            return
        try:
            async with self._write(commit=self._commit) as conn:
                if self._ha:
                    await self._ha_batch(conn, batch)  # first: the fence, the stream row
                elif self._dialect == "postgresql":
                    await self._lock_keys_and_record(conn, batch)  # one round trip for both
                await self._check_conditions(conn, batch.conditions)
                await self._apply(conn, batch)
                if self._dialect != "postgresql":
                    await self._record_write(conn, batch.write_id)
                await self._maybe_prune(conn)
        except _AmbiguousCommit as ambiguous:
            await self._resolve(batch.write_id, ambiguous.__cause__)

    async def landed(self, write_id: bytes) -> bool:
        fence = (
            _insert_for(self._dialect)(WRITES)
            .values(namespace=self.namespace, write_id=write_id, at_ms=_now_ms(), landed=False)
            .on_conflict_do_nothing(index_elements=[WRITES.c.namespace, WRITES.c.write_id])
        )
        async with self._write() as conn:
            await conn.execute(fence)
            row = await conn.execute(
                select(WRITES.c.landed).where(
                    WRITES.c.namespace == self.namespace, WRITES.c.write_id == write_id
                )
            )
            return bool(row.scalar_one())

    async def _resolve(self, write_id: bytes, cause: BaseException | None) -> None:
        """After an ambiguous commit: return if it landed, else raise (bounded time)."""
        delay = self._options.resolve_backoff_s
        for attempt in range(self._options.resolve_attempts):
            if attempt:
                await self.clock.sleep(delay)
                delay *= 2
            try:
                landed = await self.landed(write_id)
            except StoreUnavailable:
                continue
            if landed:
                return
            raise StoreUnavailable(
                f"{self._safe_url}: write failed while committing and did not land: {cause}"
            ) from cause
        raise StoreOutcomeUnknown(
            write_id, f"{self._safe_url}: write failed while committing: {cause}"
        ) from cause

    async def _commit(self, conn: AsyncConnection) -> None:
        """COMMIT the write transaction; a failure here is ambiguous."""
        await conn.commit()

    async def _record_write(self, conn: AsyncConnection, write_id: bytes) -> None:
        try:
            await conn.execute(
                WRITES.insert().values(
                    namespace=self.namespace, write_id=write_id, at_ms=_now_ms(), landed=True
                )
            )
        except exc.IntegrityError as err:
            raise self._fenced(write_id) from err

    def _fenced(self, write_id: bytes) -> StoreUnavailable:
        # landed() fenced this id (answered False): the batch must never commit now.
        return StoreUnavailable(f"{self._safe_url}: write {write_id.hex()} was fenced")

    async def _maybe_prune(self, conn: AsyncConnection) -> None:
        self._writes_since_prune += 1
        if self._writes_since_prune >= self._options.prune_every:
            self._writes_since_prune = 0
            cutoff = _now_ms() - int(self._options.write_id_retention_s * 1000)
            await conn.execute(
                delete(WRITES).where(WRITES.c.namespace == self.namespace, WRITES.c.at_ms < cutoff)
            )

    async def increment(self, counter: str, by: int = 1) -> int:
        if by < 1:
            raise ValueError("increment must be >= 1")
        insert = _insert_for(self._dialect)(COUNTERS).values(
            namespace=self.namespace, name=counter, value=by
        )
        upsert = insert.on_conflict_do_update(
            index_elements=[COUNTERS.c.namespace, COUNTERS.c.name],
            set_={"value": COUNTERS.c.value + insert.excluded.value},
        ).returning(COUNTERS.c.value)
        async with self._write() as conn:
            seq = await self._ha_claim(conn, 1) if self._ha else 0
            value = int((await conn.execute(upsert)).scalar_one())
            if self._ha:
                await self._ha_append(conn, seq, encode_changes([counter_change(counter, value)]))
            return value

    async def _lock_keys_and_record(self, conn: AsyncConnection, batch: WriteBatch) -> None:
        """PostgreSQL: advisory-lock every touched key and insert the write-id row, in one
        statement (a data-modifying CTE runs whether or not the query reads it)."""
        touched = [(c.table, c.key) for c in batch.conditions]
        touched += [(t, k) for t, k, _ in batch.puts]
        touched += list(batch.deletes)
        hashes = sorted({self._key_hash(t, k) for t, k in touched})
        # unnest() yields in array order, so locks are taken in sorted order (no deadlocks).
        try:
            await conn.execute(
                text(
                    "WITH w AS (INSERT INTO gcs_writes (namespace, write_id, at_ms, landed) "
                    "VALUES (:ns, :wid, :at, true)) "
                    "SELECT pg_advisory_xact_lock(h) FROM unnest(CAST(:hs AS BIGINT[])) AS t(h)"
                ),
                {"ns": self.namespace, "wid": batch.write_id, "at": _now_ms(), "hs": hashes},
            )
        except exc.IntegrityError as err:
            raise self._fenced(batch.write_id) from err

    async def _check_conditions(
        self, conn: AsyncConnection, conditions: Sequence[Condition]
    ) -> None:
        keys_by_table: dict[str, list[bytes]] = {}
        for cond in conditions:
            keys_by_table.setdefault(cond.table, []).append(cond.key)
        current = {
            table: await self._select_keys(conn, table, list(dict.fromkeys(keys)))
            for table, keys in keys_by_table.items()
        }
        for cond in conditions:
            if not cond.holds(current[cond.table].get(cond.key)):
                raise StoreConflict(cond.table, cond.key)

    async def _apply(self, conn: AsyncConnection, batch: WriteBatch) -> None:
        # Same result as "all puts, then all deletes" (MemoryStore's order).
        deleted = set(batch.deletes)
        final: dict[tuple[str, bytes], bytes] = {}
        for table, key, value in batch.puts:
            if (table, key) not in deleted:
                final[(table, key)] = value
        if deleted:
            stmt = delete(KV).where(
                KV.c.namespace == bindparam("ns"),
                KV.c.table_name == bindparam("tn"),
                KV.c.key == bindparam("k"),
            )
            params = [{"ns": self.namespace, "tn": t, "k": k} for t, k in deleted]
            await conn.execute(stmt, params)
        if final:
            insert = _insert_for(self._dialect)(KV)
            upsert = insert.on_conflict_do_update(
                index_elements=[KV.c.namespace, KV.c.table_name, KV.c.key],
                set_={"value": insert.excluded.value},
            )
            rows = [
                {"namespace": self.namespace, "table_name": t, "key": k, "value": v}
                for (t, k), v in final.items()
            ]
            await conn.execute(upsert, rows)

    # -- HaStore --------------------------------------------------------------------------------

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
                namespace=self.namespace, seq=seq, at_ms=_now_ms(), changes=changes
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
                        "at": _now_ms(),
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
        old = _now_ms() - int(opts.changes_max_age_s * 1000)
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

    async def renew_lease(self, holder: str, epoch: int, ttl_ms: int) -> bool:
        self._require_ha()
        check_lease_args(holder, ttl_ms)
        async with self._write() as conn:
            result = await conn.execute(self._lease.renew(holder, epoch, ttl_ms))
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
        deadline = self.clock.monotonic_s() + block_ms / 1000
        notifications = self._notifications
        while True:
            remaining_s = deadline - self.clock.monotonic_s()
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
                    with contextlib.suppress(TimeoutError):
                        wait_s = min(remaining_s, _LISTEN_RECHECK_S)
                        await within(self.clock, wait_s, asyncio.shield(waiter))
                else:
                    await self.clock.sleep(min(self._options.changes_poll_interval_s, remaining_s))
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

    # -- helpers -------------------------------------------------------------------------------

    def _in_table(self, table: str) -> tuple[Any, Any]:
        return KV.c.namespace == self.namespace, KV.c.table_name == table

    async def _select_keys(
        self, conn: AsyncConnection, table: str, keys: list[bytes]
    ) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        for start in range(0, len(keys), _IN_CHUNK):
            chunk = keys[start : start + _IN_CHUNK]
            rows = await conn.execute(
                select(KV.c.key, KV.c.value).where(*self._in_table(table), KV.c.key.in_(chunk))
            )
            found.update((bytes(k), bytes(v)) for k, v in rows)
        return found

    def _key_hash(self, table: str, key: bytes) -> int:
        digest = hashlib.blake2b(digest_size=8)
        for part in (self.namespace.encode(), table.encode()):
            digest.update(len(part).to_bytes(4, "big") + part)
        digest.update(key)
        return int.from_bytes(digest.digest(), "big", signed=True)

    def _require_engine(self) -> AsyncEngine:
        if self._engine is None:
            raise StoreUnavailable(f"{self._safe_url}: store is not open")
        return self._engine

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        async with self._translate("read"), self._transaction(self._require_engine()) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def _write(
        self, commit: Callable[[AsyncConnection], Awaitable[None]] | None = None
    ) -> AsyncIterator[AsyncConnection]:
        """A write transaction.  With ``commit``, a failure inside it raises
        :class:`_AmbiguousCommit` (chained to the StoreError) instead of StoreUnavailable."""
        engine = self._require_engine()
        lock = self._write_lock if self._write_lock is not None else contextlib.nullcontext()
        async with self._translate("write"), lock:
            if commit is None:
                async with self._transaction(engine, write=True) as conn:
                    yield conn
                return
            async with engine.connect() as conn:
                await conn.execution_options(**{_WRITE_OPTION: True})
                await conn.begin()
                try:
                    yield conn
                except BaseException:
                    with contextlib.suppress(exc.SQLAlchemyError, OSError):
                        await conn.rollback()
                    raise
                try:
                    async with self._translate("commit"):
                        await commit(conn)
                except StoreFull:  # the database refused the COMMIT: it did not land
                    with contextlib.suppress(exc.SQLAlchemyError, OSError):
                        await conn.invalidate()
                    raise
                except StoreError as err:
                    with contextlib.suppress(exc.SQLAlchemyError, OSError):
                        await conn.invalidate()
                    raise _AmbiguousCommit() from err

    @staticmethod
    @contextlib.asynccontextmanager
    async def _transaction(
        engine: AsyncEngine, *, write: bool = False
    ) -> AsyncIterator[AsyncConnection]:
        async with engine.connect() as conn:
            if write:
                await conn.execution_options(**{_WRITE_OPTION: True})
            async with conn.begin():
                yield conn

    @contextlib.asynccontextmanager
    async def _translate(self, what: str) -> AsyncIterator[None]:
        """Map driver / SQLAlchemy / Alembic errors onto the StoreError tree."""
        try:
            yield
        except StoreError:
            raise
        except exc.DBAPIError as err:
            kind = _classify(err)
            raise kind(f"{self._safe_url}: {what} failed: {err}") from err
        except (exc.DisconnectionError, exc.TimeoutError, OSError, TimeoutError) as err:
            raise StoreUnavailable(f"{self._safe_url}: {what} failed: {err}") from err
        except sqlite3.OperationalError as err:  # our one-trip BEGIN bypasses SQLAlchemy
            kind = StoreFull if _is_full(err, str(err).lower(), "") else StoreUnavailable
            raise kind(f"{self._safe_url}: {what} failed: {err}") from err
        except CommandError as err:
            raise StoreCorrupt(f"{self._safe_url}: {what}: schema problem: {err}") from err
        except exc.SQLAlchemyError as err:
            raise StoreError(f"{self._safe_url}: {what} failed: {err}") from err


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


class _AmbiguousCommit(Exception):
    """COMMIT failed: the transaction may or may not have landed (resolved by write())."""


def _now_ms() -> int:
    return int(time.time() * 1000)


# SQLSTATE classes meaning "the server is not able to serve now": connection exception,
# operator intervention (shutdown, cannot connect now), insufficient resources.
_TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "57", "53"})
# "Out of space": PostgreSQL disk_full (53100) / out_of_memory (53200); SQLite SQLITE_FULL
# ("database or disk is full": the disk, or the database's max_page_count).  The statement
# or COMMIT that hit it was refused and rolled back: nothing was written.
_FULL_SQLSTATES = frozenset({"53100", "53200"})
_SQLITE_FULL = 13


def _is_full(orig: BaseException | None, message: str, sqlstate: str) -> bool:
    if sqlstate in _FULL_SQLSTATES:
        return True
    return getattr(orig, "sqlite_errorcode", None) == _SQLITE_FULL or (
        "database or disk is full" in message
    )


# SQLite reports schema trouble as OperationalError; tell it apart from "locked" / I/O errors.
_SQLITE_SCHEMA_MESSAGES = ("no such table", "no such column", "has no column named")


def _classify(err: exc.DBAPIError) -> type[StoreError]:
    """Which StoreError a driver error becomes (most specific first, as httpx does)."""
    message = str(err.orig).lower()
    sqlstate = str(getattr(err.orig, "sqlstate", None) or getattr(err.orig, "pgcode", "") or "")
    if _is_full(err.orig, message, sqlstate):
        return StoreFull
    if err.connection_invalidated or sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES:
        return StoreUnavailable
    if isinstance(err, exc.ProgrammingError) or message.startswith(_SQLITE_SCHEMA_MESSAGES):
        return StoreCorrupt
    if isinstance(err, exc.OperationalError | exc.InterfaceError):
        return StoreUnavailable
    return StoreError


def _upgrade_if_behind(connection: Connection) -> None:
    if migrate.current_revision(connection) != migrate.head_revision():
        migrate.upgrade_connection(connection)


def _insert_for(dialect: str) -> Any:
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


def _install_sqlite_hooks(engine: AsyncEngine, *, busy_timeout_ms: int) -> None:
    """WAL + synchronous=FULL, and take over BEGIN so writers can use BEGIN IMMEDIATE."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # the driver must not emit its own BEGIN
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        finally:
            cursor.close()

    @event.listens_for(engine.sync_engine, "reset")
    def _on_reset(dbapi_connection: Any, _record: Any, _state: Any) -> None:
        driver = getattr(dbapi_connection, "_connection", None)
        if driver is None or getattr(driver, "in_transaction", True):
            dbapi_connection.rollback()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get(_WRITE_OPTION, False)
        statement = "BEGIN IMMEDIATE" if immediate else "BEGIN"
        dbapi = conn.connection.dbapi_connection
        if dbapi is not None and hasattr(dbapi, "run_async"):
            # One trip to aiosqlite's thread instead of three (cursor, execute, close).
            dbapi.run_async(lambda driver: _run_statement(driver, statement))
        else:
            conn.exec_driver_sql(statement)


async def _run_statement(driver: Any, statement: str) -> None:
    cursor = await driver.execute(statement)
    await cursor.close()


def _prefix_upper_bound(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value
