"""A full store refuses writes: the client hears UNAVAILABLE "nothing was written", the
refusal is counted (``gcs_store_failures{outcome="full"}``), and nothing is left pending.

Real backends, filled for real: a private redis-server at ``maxmemory`` with noeviction, and
SQLite answering SQLITE_FULL ("database or disk is full"), and PostgreSQL's disk_full
(53100) raised by the server itself.  The SQLite file is capped with
``PRAGMA max_page_count`` -- SQLite's own limit, refused with the very error a full disk
gives -- as a small filesystem would need root to mount.  (Old code: Redis answered INTERNAL
"store error: script failed: command not allowed when used memory > 'maxmemory'"; SQLite
left the write "may have been applied" and blocked the next ones.)
"""

from __future__ import annotations

import contextlib
import pathlib
import sqlite3
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis
from prometheus_client import generate_latest
from sqlalchemy import event, exc

from gcs.proto import gcs_service_pb2 as Req
from gcs.server import GcsServer
from gcs.store.sql.store import SqlStore
from gcs.testing.postgres import PostgresServer
from gcs.testing.processes import find_binary
from gcs.testing.redis_server import RedisServer, redis_server
from tests.conftest import Stubs, fast_config

VALUE = b"v" * 64 * 1024  # needs new pages / memory wherever it goes


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    """Our own redis-server: its maxmemory is changed, so it is not the shared one."""
    with redis_server(appendonly=False) as server:
        yield server


@contextlib.asynccontextmanager
async def _serve(storage: str) -> AsyncIterator[tuple[GcsServer, Stubs]]:
    server = GcsServer(fast_config(storage=storage))
    await server.start()
    try:
        assert server.meta is not None
        async with grpc.aio.insecure_channel(server.address) as channel:
            yield server, Stubs(channel, server.meta.cluster_id)
    finally:
        await server.stop()


async def _put(stubs: Stubs, key: bytes) -> Any:
    return await stubs.kv.InternalKVPut(
        Req.InternalKVPutRequest(namespace=b"ns", key=key, value=VALUE, overwrite=True)
    )


async def _get(stubs: Stubs, key: bytes) -> bytes | None:
    reply = await stubs.kv.InternalKVGet(Req.InternalKVGetRequest(namespace=b"ns", key=key))
    return reply.value if reply.status.code == 0 else None


def _full_refusals(server: GcsServer) -> float:
    for line in generate_latest(server.metrics.registry).decode().splitlines():
        labels = ('outcome="full"', 'op="write"')
        if line.startswith("gcs_store_failures_total{") and all(x in line for x in labels):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _assert_refused_as_full(server: GcsServer, stubs: Stubs) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _put(stubs, b"refused")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
    assert "store full, nothing was written" in (info.value.details() or "")
    assert _full_refusals(server) >= 1


class TestRedisAtMaxmemory:
    async def test_a_write_is_refused_unavailable_and_counted_and_the_next_one_works(
        self, private_redis: RedisServer
    ) -> None:
        admin = aioredis.Redis.from_url(private_redis.url)
        try:
            async with _serve(private_redis.url) as (server, stubs):
                await _put(stubs, b"before")
                await admin.config_set("maxmemory-policy", "noeviction")
                await admin.config_set("maxmemory", 1)  # below what Redis already uses
                try:
                    await _assert_refused_as_full(server, stubs)
                    assert await _get(stubs, b"before") == VALUE  # reads still served
                finally:
                    await admin.config_set("maxmemory", 0)
                assert await _get(stubs, b"refused") is None  # nothing was written, truly
                await _put(stubs, b"after")  # nothing left pending in the lane
                assert await _get(stubs, b"after") == VALUE
        finally:
            await admin.aclose()


class TestSqliteFull:
    async def test_a_write_is_refused_unavailable_and_counted_and_the_next_one_works(
        self, tmp_path: pathlib.Path
    ) -> None:
        async with _serve(f"sqlite:///{tmp_path / 'gcs.db'}") as (server, stubs):
            store = server.store
            assert isinstance(store, SqlStore)
            engine = store._engine
            assert engine is not None
            cap = {"pages": 0}

            def capped(dbapi_connection: Any, _record: Any) -> None:
                if cap["pages"]:
                    cursor = dbapi_connection.cursor()
                    cursor.execute(f"PRAGMA max_page_count = {cap['pages']}")
                    cursor.close()

            event.listen(engine.sync_engine, "connect", capped)
            async with engine.connect() as conn:
                pages = (await conn.exec_driver_sql("PRAGMA page_count")).scalar_one()
            cap["pages"] = int(pages)  # the file may not grow by a single page
            await engine.dispose()  # every connection from now on is capped
            await _assert_refused_as_full(server, stubs)
            cap["pages"] = 0
            await engine.dispose()
            assert await _get(stubs, b"refused") is None
            await _put(stubs, b"after")
            assert await _get(stubs, b"after") == VALUE

    async def test_a_full_disk_at_commit_is_refused_at_once_not_ambiguous(
        self, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """In WAL mode a full disk shows at COMMIT (the pages go to the log then): SQLite
        rolled the transaction back, so it is "nothing was written", not a write to resolve
        (fault injected at the driver-error level: a real full disk needs root to make)."""
        async with _serve(f"sqlite:///{tmp_path / 'gcs.db'}") as (server, stubs):
            store = server.store
            assert isinstance(store, SqlStore)
            landed_asked = 0
            real_landed = store.landed

            async def full_commit(conn: Any) -> None:
                raise exc.OperationalError(
                    "COMMIT", None, sqlite3.OperationalError("database or disk is full")
                )

            async def counting_landed(write_id: bytes) -> bool:
                nonlocal landed_asked
                landed_asked += 1
                return await real_landed(write_id)

            monkeypatch.setattr(store, "_commit", full_commit)
            monkeypatch.setattr(store, "landed", counting_landed)
            await _assert_refused_as_full(server, stubs)
            assert landed_asked == 0, "a refused COMMIT is definite: nothing to resolve"
            monkeypatch.undo()
            await _put(stubs, b"after")
            assert await _get(stubs, b"refused") is None


@pytest.fixture(scope="module")
def private_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    yield server
    server.cleanup()


def _psql(server: PostgresServer, database: str, sql: str) -> None:
    psql = find_binary("psql", package="postgresql")
    subprocess.run(
        [psql, "-h", "127.0.0.1", "-p", str(server.port), "-U", server.superuser,
         "-d", database, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql],
        check=True, capture_output=True,
    )  # fmt: skip


_DISK_FULL_TRIGGER = """
CREATE FUNCTION gcs_test_disk_full() RETURNS trigger AS $$
BEGIN
  RAISE EXCEPTION 'could not extend file "base/1/2": No space left on device'
    USING ERRCODE = 'disk_full';
END $$ LANGUAGE plpgsql;
CREATE TRIGGER gcs_test_disk_full BEFORE INSERT OR UPDATE ON gcs_kv
  FOR EACH ROW WHEN (position('refused'::bytea in NEW.key) > 0)
  EXECUTE FUNCTION gcs_test_disk_full();
"""
"""PostgreSQL's own disk-full refusal (SQLSTATE 53100, the message a full tablespace gives)
raised by the server for keys holding ``refused`` only: a real full disk needs a small
filesystem, which needs root to mount."""


class TestPostgresFull:
    async def test_a_disk_full_refusal_is_unavailable_nothing_written_and_counted(
        self, private_postgres: PostgresServer
    ) -> None:
        database = f"full_{uuid.uuid4().hex[:8]}"
        url = private_postgres.create_database(database)
        async with _serve(url) as (server, stubs):
            await _put(stubs, b"before")  # the schema is in place
            _psql(private_postgres, database, _DISK_FULL_TRIGGER)
            await _assert_refused_as_full(server, stubs)
            assert await _get(stubs, b"refused") is None
            await _put(stubs, b"after")  # nothing left pending in the lane
            assert await _get(stubs, b"after") == VALUE
