"""SQLAlchemy at the SQL store's boundary: engines, transactions, and the translation of
driver errors onto the :class:`~gcs.store.errors.StoreError` tree (never a SQLAlchemy or
driver exception out)."""

from __future__ import annotations

import contextlib
import pathlib
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

from alembic.util.exc import CommandError
from sqlalchemy import event, exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from gcs.store.errors import StoreCorrupt, StoreError, StoreFull, StoreUnavailable
from gcs.store.sql.options import SqlOptions

__all__ = [
    "WRITE_OPTION",
    "create_engine",
    "insert_for",
    "prefix_upper_bound",
    "signed64",
    "transaction",
    "translate",
]

# Execution option that marks a connection's transaction as a writer (SQLite: BEGIN IMMEDIATE).
WRITE_OPTION = "gcs_write"


def create_engine(driver_url: str, dialect: str, opts: SqlOptions) -> AsyncEngine:
    """An engine for ``driver_url`` (SQLite: WAL, synchronous=FULL, BEGIN IMMEDIATE for
    writers; PostgreSQL: a pre-pinged pool with the options' timeouts)."""
    if dialect == "sqlite":
        database = make_url(driver_url).database
        if database and database != ":memory:":
            pathlib.Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(
            driver_url,
            connect_args={"timeout": opts.busy_timeout_s},
            # Every use ends its transaction; the reset hook below rolls back only a
            # connection that did not (saves a driver-thread round trip per call).
            pool_reset_on_return=None,
        )
        _install_sqlite_hooks(engine, busy_timeout_ms=int(opts.busy_timeout_s * 1000))
        return engine
    return create_async_engine(
        driver_url,
        pool_pre_ping=True,  # replace connections that died in an outage before use
        pool_size=opts.pool_size,
        pool_timeout=opts.command_timeout_s,
        connect_args={
            "timeout": opts.connect_timeout_s,
            "command_timeout": opts.command_timeout_s,
            "server_settings": {"application_name": "gcs"},
        },
    )


@contextlib.asynccontextmanager
async def transaction(
    engine: AsyncEngine, *, write: bool = False
) -> AsyncIterator[AsyncConnection]:
    async with engine.connect() as conn:
        if write:
            await conn.execution_options(**{WRITE_OPTION: True})
        async with conn.begin():
            yield conn


@contextlib.asynccontextmanager
async def translate(safe_url: str, what: str) -> AsyncIterator[None]:
    """Map driver / SQLAlchemy / Alembic errors onto the StoreError tree."""
    try:
        yield
    except StoreError:
        raise
    except exc.DBAPIError as err:
        kind = _classify(err)
        raise kind(f"{safe_url}: {what} failed: {err}") from err
    except (exc.DisconnectionError, exc.TimeoutError, OSError, TimeoutError) as err:
        raise StoreUnavailable(f"{safe_url}: {what} failed: {err}") from err
    except sqlite3.OperationalError as err:  # our one-trip BEGIN bypasses SQLAlchemy
        kind = StoreFull if _is_full(err, str(err).lower(), "") else StoreUnavailable
        raise kind(f"{safe_url}: {what} failed: {err}") from err
    except CommandError as err:
        raise StoreCorrupt(f"{safe_url}: {what}: schema problem: {err}") from err
    except exc.SQLAlchemyError as err:
        raise StoreError(f"{safe_url}: {what} failed: {err}") from err


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


def insert_for(dialect: str) -> Any:
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
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
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


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def signed64(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value
