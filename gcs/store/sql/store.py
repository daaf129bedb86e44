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
  (``gcs.store.sql.ha``), polling when that is not possible (SQLite, a lost connection).
* The stream is trimmed by count and age every ``changes_trim_every`` batches, always a
  prefix, so a reader behind the trim sees the gap (ChangesTrimmed).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, delete, exc, select, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gcs.base.clock import Clock, SystemClock
from gcs.store.base import Condition, Store, WriteBatch
from gcs.store.errors import (
    StoreConflict,
    StoreError,
    StoreFull,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from gcs.store.ha import HaStore
from gcs.store.ha_parts import counter_change, encode_changes
from gcs.store.sql import migrate
from gcs.store.sql.engine import (
    WRITE_OPTION,
    create_engine,
    insert_for,
    prefix_upper_bound,
    signed64,
    transaction,
    translate,
)
from gcs.store.sql.ha import LeaseStatements, PgNotifications
from gcs.store.sql.options import SqlOptions
from gcs.store.sql.schema import COUNTERS, KV, LEASE, WRITES
from gcs.store.sql.stream import SqlHaStream, now_ms
from gcs.store.sql.url import normalize_sql_url

__all__ = ["SqlOptions", "SqlStore"]

# Advisory lock key serialising concurrent schema upgrades on PostgreSQL ("gcs_migr").
_MIGRATION_LOCK_KEY = 0x6763735F6D696772
# Keep IN (...) lists well under every driver's bind-parameter limit.
_IN_CHUNK = 500


class SqlStore(SqlHaStream, Store, HaStore):
    """:class:`Store` over SQLite or PostgreSQL.  Build with a URL, then ``await open()``."""

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "default",
        options: SqlOptions = SqlOptions.default,
        ha: bool = False,
        clock: Clock | None = None,
    ) -> None:
        """``clock``: what waits and stamps run on (the server passes its own; a store
        built alone uses the system clock)."""
        self.url = url
        self._clock = clock or SystemClock()
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
            self._notifications = PgNotifications(
                dsn, namespace, options.connect_timeout_s, self._clock
            )

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        if self._engine is not None:
            return
        async with translate(self._safe_url, "open"):
            engine = create_engine(self._driver_url, self._dialect, self._options)
        try:
            async with (
                translate(self._safe_url, "migrate"),
                transaction(engine, write=True) as conn,
            ):
                if self._dialect == "postgresql":
                    await conn.execute(
                        text("SELECT pg_advisory_xact_lock(:k)"),
                        {"k": signed64(_MIGRATION_LOCK_KEY)},
                    )
                await conn.run_sync(_upgrade_if_behind)
                if self._ha:
                    await conn.execute(
                        insert_for(self._dialect)(LEASE)
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
        upper = prefix_upper_bound(prefix)
        if upper is not None:
            where.append(KV.c.key < upper)
        async with self._read() as conn:
            rows = await conn.execute(select(KV.c.key, KV.c.value).where(*where))
            return {bytes(k): bytes(v) for k, v in rows if bytes(k).startswith(prefix)}

    async def scan_keys(self, table: str, prefix: bytes, *, max_bytes: int) -> list[bytes] | None:
        where = [*self._in_table(table), KV.c.key >= prefix]
        upper = prefix_upper_bound(prefix)
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
            insert_for(self._dialect)(WRITES)
            .values(
                namespace=self.namespace, write_id=write_id, at_ms=now_ms(self._clock), landed=False
            )
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
                await self._clock.sleep(delay)
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
                    namespace=self.namespace,
                    write_id=write_id,
                    at_ms=now_ms(self._clock),
                    landed=True,
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
            cutoff = now_ms(self._clock) - int(self._options.write_id_retention_s * 1000)
            await conn.execute(
                delete(WRITES).where(WRITES.c.namespace == self.namespace, WRITES.c.at_ms < cutoff)
            )

    async def increment(self, counter: str, by: int = 1) -> int:
        if by < 1:
            raise ValueError("increment must be >= 1")
        insert = insert_for(self._dialect)(COUNTERS).values(
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
                {
                    "ns": self.namespace,
                    "wid": batch.write_id,
                    "at": now_ms(self._clock),
                    "hs": hashes,
                },
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
            insert = insert_for(self._dialect)(KV)
            upsert = insert.on_conflict_do_update(
                index_elements=[KV.c.namespace, KV.c.table_name, KV.c.key],
                set_={"value": insert.excluded.value},
            )
            rows = [
                {"namespace": self.namespace, "table_name": t, "key": k, "value": v}
                for (t, k), v in final.items()
            ]
            await conn.execute(upsert, rows)

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
        async with translate(self._safe_url, "read"), transaction(self._require_engine()) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def _write(
        self, commit: Callable[[AsyncConnection], Awaitable[None]] | None = None
    ) -> AsyncIterator[AsyncConnection]:
        """A write transaction.  With ``commit``, a failure inside it raises
        :class:`_AmbiguousCommit` (chained to the StoreError) instead of StoreUnavailable."""
        engine = self._require_engine()
        lock = self._write_lock if self._write_lock is not None else contextlib.nullcontext()
        async with translate(self._safe_url, "write"), lock:
            if commit is None:
                async with transaction(engine, write=True) as conn:
                    yield conn
                return
            async with engine.connect() as conn:
                await conn.execution_options(**{WRITE_OPTION: True})
                await conn.begin()
                try:
                    yield conn
                except BaseException:
                    with contextlib.suppress(exc.SQLAlchemyError, OSError):
                        await conn.rollback()
                    raise
                try:
                    async with translate(self._safe_url, "commit"):
                        await commit(conn)
                except StoreFull:  # the database refused the COMMIT: it did not land
                    with contextlib.suppress(exc.SQLAlchemyError, OSError):
                        await conn.invalidate()
                    raise
                except StoreError as err:
                    with contextlib.suppress(exc.SQLAlchemyError, OSError):
                        await conn.invalidate()
                    raise _AmbiguousCommit() from err


class _AmbiguousCommit(Exception):
    """COMMIT failed: the transaction may or may not have landed (resolved by write())."""


def _upgrade_if_behind(connection: Connection) -> None:
    if migrate.current_revision(connection) != migrate.head_revision():
        migrate.upgrade_connection(connection)
