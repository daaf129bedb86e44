"""Definite answers from the store (issue 12, defect 5): a write that fails ambiguously is
resolved through its write id before the caller hears about it, on SQLite, PostgreSQL and
Redis.  "StoreUnavailable" (the server's "nothing was written") is only raised when true."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from sqlalchemy.dialects.sqlite.aiosqlite import AsyncAdapt_aiosqlite_connection

from gcs.store import StoreOutcomeUnknown, StoreUnavailable, WriteBatch
from gcs.store.base import Store
from gcs.store.redis.store import RedisOptions, RedisStore
from gcs.store.sql.store import SqlOptions, SqlStore
from gcs.testing.postgres import PostgresServer
from gcs.testing.redis_server import RedisServer

FAST_RESOLVE = SqlOptions(resolve_backoff_s=0.01)


@pytest.fixture(params=("sqlite", "postgres"))
async def sql_store(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> AsyncIterator[SqlStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'w.db'}"
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        url = server.url()
    store = SqlStore(url, namespace=f"w{uuid.uuid4().hex[:10]}", options=FAST_RESOLVE)
    await store.open()
    yield store
    await store.close()


@pytest.fixture
def commit_then_drop(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """Arm: the next ``n`` driver COMMITs succeed and then raise, like a connection dropped
    after the server committed (the reply was lost)."""
    armed: list[int] = [0]

    def patch(cls: type) -> None:
        original = cls.commit

        def commit(self: object) -> None:
            original(self)
            if armed[0]:
                armed[0] -= 1
                raise ConnectionResetError("connection reset after COMMIT")

        monkeypatch.setattr(cls, "commit", commit)

    patch(AsyncAdapt_aiosqlite_connection)
    patch(AsyncAdapt_asyncpg_connection)

    def arm(times: int = 1) -> None:
        armed[0] = times

    return arm


class TestSql:
    async def test_commit_that_landed_is_not_reported_as_failed(
        self, sql_store: SqlStore, commit_then_drop: Callable[[int], None]
    ) -> None:
        """The reply to COMMIT is lost but the row is there: write() returns (old code:
        StoreUnavailable, "nothing was written", for a write that is in the store)."""
        batch = WriteBatch().put("NODE", b"n1", b"alive")
        commit_then_drop(1)
        await sql_store.write(batch)
        assert await sql_store.get("NODE", b"n1") == b"alive"
        assert await sql_store.landed(batch.write_id)

    async def test_unresolvable_commit_is_outcome_unknown_then_resolved(
        self,
        sql_store: SqlStore,
        commit_then_drop: Callable[[int], None],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """While the database stays away after an ambiguous COMMIT: StoreOutcomeUnknown
        (never StoreUnavailable); once it is back, landed() tells the truth."""

        async def away(_write_id: bytes) -> bool:
            raise StoreUnavailable("still away")

        batch = WriteBatch().put("NODE", b"n2", b"alive")
        commit_then_drop(1)
        monkeypatch.setattr(sql_store, "landed", away)
        with pytest.raises(StoreOutcomeUnknown) as info:
            await sql_store.write(batch)
        assert info.value.write_id == batch.write_id
        monkeypatch.undo()
        assert await sql_store.landed(batch.write_id)
        assert await sql_store.get("NODE", b"n2") == b"alive"

    async def test_failure_before_commit_is_unavailable_and_nothing_landed(
        self, sql_store: SqlStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A statement fails inside the transaction: certainly not landed."""

        async def broken(_conn: object, _batch: WriteBatch) -> None:
            raise ConnectionResetError("dropped before COMMIT")

        batch = WriteBatch().put("NODE", b"n3", b"alive")
        monkeypatch.setattr(sql_store, "_apply", broken)
        with pytest.raises(StoreUnavailable):
            await sql_store.write(batch)
        monkeypatch.undo()
        assert await sql_store.get("NODE", b"n3") is None
        assert not await sql_store.landed(batch.write_id)

    async def test_old_write_ids_are_pruned(self, tmp_path: pathlib.Path) -> None:
        """Write ids are kept for the retention only (bounded table)."""
        options = SqlOptions(write_id_retention_s=0.0, prune_every=4)
        async with SqlStore(f"sqlite:///{tmp_path / 'p.db'}", options=options) as store:
            for i in range(9):
                await store.put("KV", str(i).encode(), b"v")
            async with store._read() as conn:
                from sqlalchemy import func, select

                from gcs.store.sql.schema import WRITES

                rows = (await conn.execute(select(func.count()).select_from(WRITES))).scalar_one()
            assert rows <= 4


class TestFence:
    """landed() == False is final: the batch cannot land afterwards (all durable backends)."""

    async def test_fenced_batch_never_lands(self, durable_backend: object) -> None:
        store: Store = await durable_backend.open()  # type: ignore[attr-defined]
        batch = WriteBatch().put("KV", b"late", b"copy")
        assert not await store.landed(batch.write_id)
        with pytest.raises(StoreUnavailable):
            await store.write(batch)  # a copy of the batch arriving after the answer
        assert await store.get("KV", b"late") is None
        landed_batch = WriteBatch().put("KV", b"on-time", b"v")
        await store.write(landed_batch)
        assert await store.landed(landed_batch.write_id)


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    _signal(server, signal.SIGCONT)
    server.cleanup()


async def _redis_drained(server: RedisServer, timeout_s: float = 30.0) -> None:
    """Wait until Redis has processed every command already sent to it (no client, except
    this one, has unread bytes in its query buffer): a late copy of a write sent before the
    stall has then either applied or never will."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(server.url)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            me = await client.client_id()
            pending = [
                c for c in await client.client_list() if int(c["id"]) != me and int(c["qbuf"])
            ]
            if not pending:
                return
            assert loop.time() < deadline, f"commands still queued in redis: {pending}"
            await asyncio.sleep(0.01)
    finally:
        await client.aclose()


def _signal(server: RedisServer, sig: int) -> None:
    proc = server._proc
    if proc is not None and proc.poll() is None:
        os.kill(proc.pid, sig)


class TestRedis:
    """A Redis that stops answering (SIGSTOP: commands sit in its socket buffers and run when
    it resumes, as after a long pause) past the retry budget."""

    async def test_stalled_past_the_budget_is_outcome_unknown_and_resolves_truthfully(
        self, private_redis: RedisServer
    ) -> None:
        """Old code: StoreUnavailable, then the write lands when Redis resumes."""
        options = RedisOptions(socket_timeout_s=0.5, connect_timeout_s=0.5, retries=0)
        async with RedisStore(private_redis.url, namespace="stall", options=options) as store:
            await store.put("NODE", b"warm", b"up")  # scripts loaded, connection pooled
            batch = WriteBatch().put("NODE", b"n", b"alive")
            _signal(private_redis, signal.SIGSTOP)
            try:
                with pytest.raises(StoreOutcomeUnknown):
                    await store.write(batch)
            finally:
                _signal(private_redis, signal.SIGCONT)
            landed = await store.landed(batch.write_id)
            assert (await store.get("NODE", b"n") == b"alive") == landed
            await _redis_drained(private_redis)  # nothing still in flight may change it
            assert (await store.get("NODE", b"n") == b"alive") == landed
            assert await store.landed(batch.write_id) == landed

    async def test_resumed_during_resolution_gives_a_true_answer(
        self, private_redis: RedisServer
    ) -> None:
        """Redis resumes while write() resolves the outcome: whatever write() says is what
        the store holds (returned: present; StoreUnavailable: absent, and stays absent)."""
        options = RedisOptions(socket_timeout_s=1.0, connect_timeout_s=1.0, retries=0)
        async with RedisStore(private_redis.url, namespace="resume", options=options) as store:
            await store.put("NODE", b"warm", b"up")  # scripts loaded, connection pooled
            batch = WriteBatch().put("NODE", b"n", b"alive")
            _signal(private_redis, signal.SIGSTOP)
            loop = asyncio.get_running_loop()
            handle = loop.call_later(1.4, _signal, private_redis, signal.SIGCONT)
            outcome: BaseException | None = None
            try:
                await store.write(batch)
            except (StoreUnavailable, StoreOutcomeUnknown) as err:
                outcome = err
            finally:
                handle.cancel()
                _signal(private_redis, signal.SIGCONT)
            await _redis_drained(private_redis)
            present = await store.get("NODE", b"n") == b"alive"
            if outcome is None:
                assert present
            elif isinstance(outcome, StoreUnavailable):
                assert not present, "StoreUnavailable said nothing was written"
            else:
                assert await store.landed(batch.write_id) == present
