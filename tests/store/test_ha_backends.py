"""What the HA contract needs from each real backend beyond the shared suite: epochs and
the stream survive a restart, PostgreSQL's NOTIFY wakes readers, Redis replicates the
stream entry with its batch, and a store without ``ha`` neither pays nor pretends."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import sqlite3
import uuid

import asyncpg
import pytest
from structlog.testing import capture_logs

from gcs.base.clock import SystemClock
from gcs.store import WriteBatch, store_from_url
from gcs.store.ha import Change, ChangesTrimmed
from gcs.store.memory import MemoryStore
from gcs.store.redis.ha import HaKeys
from gcs.store.redis.store import RedisOptions, RedisStore
from gcs.store.sql.store import SqlOptions, SqlStore
from gcs.testing.postgres import PostgresServer
from gcs.testing.redis_sentinels import RedisSentinels, redis_sentinels
from gcs.testing.redis_server import RedisServer

TTL_MS = 60_000


def _namespace() -> str:
    return f"h{uuid.uuid4().hex[:12]}"


class TestRestart:
    """Epochs never go backwards and the stream keeps its numbers across a restart of the
    store (a Redis with appendonly restarted; a SQL database reopened)."""

    async def _survives(self, make: object, restart: object) -> None:
        first = make()  # type: ignore[operator]
        await first.open()
        epoch = await first.try_acquire_lease("a", TTL_MS)
        assert epoch is not None
        first.fence(epoch)
        await first.put("KV", b"k", b"v")
        await first.increment("c")
        cursor = await first.change_cursor()
        await first.close()
        await restart()  # type: ignore[operator]
        second = make()  # type: ignore[operator]
        await second.open()
        try:
            info = await second.read_lease()
            assert info is not None and (info.holder, info.epoch) == ("a", epoch)
            assert await second.try_acquire_lease("b", TTL_MS) is None  # still live
            again = await second.try_acquire_lease("a", TTL_MS)
            assert again is not None and again > epoch
            assert await second.change_cursor() == cursor
            _, changes = await second.read_changes(b"0")
            assert changes == [Change("KV", b"k", b"v"), Change("", b"c", b"1")]
            second.fence(again)
            await second.put("KV", b"k", b"w")
            assert await second.change_cursor() != cursor
        finally:
            await second.close()

    async def test_redis_with_appendonly_restarted(self) -> None:
        """kill -9 of redis-server and a start on the same data directory."""
        server = RedisServer().start()
        namespace = _namespace()

        async def restart() -> None:
            server.stop(kill=True)
            server.start()

        try:
            await self._survives(
                lambda: RedisStore(server.url, namespace=namespace, ha=True), restart
            )
        finally:
            server.cleanup()

    async def test_postgres_restarted(self, postgres_server: PostgresServer) -> None:
        """The database server stopped and started again under the store."""
        namespace = _namespace()

        async def restart() -> None:
            postgres_server.stop()
            postgres_server.start()

        try:
            await self._survives(
                lambda: SqlStore(postgres_server.url(), namespace=namespace, ha=True), restart
            )
        finally:
            postgres_server.start()

    async def test_sqlite_reopened(self, tmp_path: pathlib.Path) -> None:
        """A new store object on the same file."""
        url = f"sqlite:///{tmp_path / 'ha.db'}"

        async def nothing() -> None:
            return None

        await self._survives(lambda: SqlStore(url, namespace="n", ha=True), nothing)


class TestSentinelFailover:
    async def test_lease_epoch_and_stream_survive_kill_9_of_the_master(self) -> None:
        """Lease grants and batches wait for the replica: after the master is killed and
        the replica promoted, the lease, its epoch and every acknowledged batch are there,
        and the next grant is a greater epoch (never one given out before)."""
        with redis_sentinels() as sentinels:
            namespace = _namespace()
            options = RedisOptions(socket_timeout_s=1.0, connect_timeout_s=0.5)
            leader = RedisStore(sentinels.url, namespace=namespace, options=options, ha=True)
            await leader.open()
            try:
                epoch = await leader.try_acquire_lease("a", TTL_MS)
                assert epoch is not None
                leader.fence(epoch)
                for i in range(20):
                    await leader.put("KV", b"k%d" % i, b"v")
                cursor = await leader.change_cursor()
                old = sentinels.master()
                old.stop(kill=True)
                await asyncio.to_thread(sentinels.wait_for_new_master, old)
                standby = RedisStore(sentinels.url, namespace=namespace, ha=True)
                await standby.open()
                try:
                    info = await standby.read_lease()
                    assert info is not None and (info.holder, info.epoch) == ("a", epoch)
                    assert await standby.change_cursor() == cursor
                    _, changes = await standby.read_changes(b"0")
                    assert [c.key for c in changes] == [b"k%d" % i for i in range(20)]
                    await standby.topology.client.delete(  # type: ignore[union-attr]
                        HaKeys.of(f"RAY{namespace}@".encode()).lease
                    )
                    assert await standby.try_acquire_lease("b", TTL_MS) == epoch + 1
                finally:
                    await standby.close()
            finally:
                await leader.close()


class _ShiftedClock(SystemClock):
    """The system clock, its wall time moved ahead by ``shift_s`` (the host clock the rows
    are stamped with, hours later)."""

    shift_s = 0.0

    def now_s(self) -> float:
        return super().now_s() + self.shift_s


class TestSqlTrimming:
    async def test_batches_older_than_the_age_bound_are_trimmed_under_the_count_bound(
        self, tmp_path: pathlib.Path
    ) -> None:
        """Two hours later (the host clock the rows are stamped with), the next trim drops
        every batch older than the hour the default keeps: an old cursor is trimmed, the
        newest batch is still there."""
        options = SqlOptions(changes_trim_every=1)
        clock = _ShiftedClock()
        store = SqlStore(f"sqlite:///{tmp_path / 'age.db'}", options=options, ha=True, clock=clock)
        await store.open()
        try:
            for i in range(5):
                await store.put("KV", b"k%d" % i, b"v")
            clock.shift_s = 7200.0
            await store.put("KV", b"late", b"v")
            with pytest.raises(ChangesTrimmed):
                await store.read_changes(b"0")
            _, changes = await store.read_changes(b"5")
            assert changes == [Change("KV", b"late", b"v")]
        finally:
            await store.close()


class TestPostgresNotifications:
    """A blocked reader on PostgreSQL is woken by NOTIFY, not by polling."""

    async def test_a_blocked_reader_wakes_with_polling_all_but_off(
        self, postgres_server: PostgresServer
    ) -> None:
        """With a ten-minute poll interval only the notification can end the wait."""
        options = SqlOptions(changes_poll_interval_s=600.0)
        namespace = _namespace()
        reader = SqlStore(postgres_server.url(), namespace=namespace, options=options, ha=True)
        writer = SqlStore(postgres_server.url(), namespace=namespace, ha=True)
        other = SqlStore(postgres_server.url(), namespace=_namespace(), ha=True)
        for store in (reader, writer, other):
            await store.open()
        try:
            cursor = await reader.change_cursor()
            pending = asyncio.create_task(reader.read_changes(cursor, block_ms=600_000))
            await other.put("KV", b"elsewhere", b"x")  # another namespace: not for us
            await writer.put("KV", b"k", b"v")
            _, changes = await pending
            assert changes == [Change("KV", b"k", b"v")]
        finally:
            for store in (reader, writer, other):
                await store.close()

    async def test_a_reader_whose_listen_connection_died_still_gets_the_changes(
        self, postgres_server: PostgresServer
    ) -> None:
        """The LISTEN session is terminated by the server: the waiting reader is woken,
        reconnects, and the next write reaches it."""
        namespace = _namespace()
        options = SqlOptions(changes_poll_interval_s=600.0)
        reader = SqlStore(postgres_server.url(), namespace=namespace, options=options, ha=True)
        writer = SqlStore(postgres_server.url(), namespace=namespace, ha=True)
        for store in (reader, writer):
            await store.open()
        try:
            cursor = await reader.change_cursor()
            first = asyncio.create_task(reader.read_changes(cursor, block_ms=600_000))
            await writer.put("KV", b"a", b"1")
            cursor, _ = await first
            admin = await asyncpg.connect(postgres_server.url())
            try:
                killed = await admin.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE query LIKE 'LISTEN%'"
                )
            finally:
                await admin.close()
            assert killed >= 1
            second = asyncio.create_task(reader.read_changes(cursor, block_ms=600_000))
            await writer.put("KV", b"b", b"2")
            _, changes = await second
            assert changes == [Change("KV", b"b", b"2")]
        finally:
            for store in (reader, writer):
                await store.close()


class TestRedisSpecifics:
    async def test_the_lease_expires_on_redis_clock_by_pexpire(
        self, redis_server: RedisServer
    ) -> None:
        """The lease key carries the TTL (PTTL) and vanishing is what makes it free."""
        store = RedisStore(redis_server.url, namespace=_namespace(), ha=True)
        await store.open()
        try:
            await store.try_acquire_lease("a", 45_000)
            keys = HaKeys.of(b"RAY" + store.namespace.encode() + b"@")
            pttl = redis_server.client().pttl(keys.lease)
            assert 0 < pttl <= 45_000
            assert await store.try_acquire_lease("b", TTL_MS) is None
            redis_server.client().pexpire(keys.lease, 0)  # its time is up, as Redis sees it
            assert await store.try_acquire_lease("b", TTL_MS) == 2
        finally:
            await store.close()

    async def test_the_stream_entry_reaches_the_replica_with_its_batch(
        self, sentinel_deployment: RedisSentinels
    ) -> None:
        """WAIT covers the entry: when the write returns, the replica holds it."""
        store = RedisStore(sentinel_deployment.url, namespace=_namespace(), ha=True)
        await store.open()
        try:
            await store.write(WriteBatch().put("KV", b"k", b"v"))
            master = sentinel_deployment.master()
            replica = next(n for n in sentinel_deployment.nodes if n is not master)
            keys = HaKeys.of(b"RAY" + store.namespace.encode() + b"@")
            entries = replica.client().xrange(keys.changes)
            assert [entry_id for entry_id, _ in entries] == [b"1-0"]
        finally:
            await store.close()


class TestWithoutHa:
    """A store built without ``ha`` writes exactly as before and refuses the HA calls."""

    async def test_redis_without_ha_keeps_no_ha_state_and_refuses_ha_calls(
        self, redis_server: RedisServer
    ) -> None:
        """No lease, epoch or stream keys appear; lease / fence / stream calls raise."""
        store = RedisStore(redis_server.url, namespace=_namespace())
        await store.open()
        try:
            await store.write(WriteBatch().put("KV", b"k", b"v"))
            await store.increment("c")
            keys = set(redis_server.client().keys(f"RAY{store.namespace}@*".encode()))
            assert f"RAY{store.namespace}@KV".encode() in keys
            assert not keys & set(HaKeys.of(f"RAY{store.namespace}@".encode()))
            with pytest.raises(RuntimeError, match="ha=True"):
                await store.try_acquire_lease("a", TTL_MS)
            with pytest.raises(RuntimeError, match="ha=True"):
                store.fence(1)
            with pytest.raises(RuntimeError, match="ha=True"):
                await store.read_changes(b"0")
        finally:
            await store.close()

    async def test_sql_without_ha_keeps_no_ha_state_and_refuses_ha_calls(
        self, tmp_path: pathlib.Path
    ) -> None:
        """No lease row, no change rows; lease / fence / stream calls raise."""
        path = tmp_path / "plain.db"
        store = SqlStore(f"sqlite:///{path}", namespace="n")
        await store.open()
        try:
            await store.write(WriteBatch().put("KV", b"k", b"v"))
            await store.increment("c")
            with pytest.raises(RuntimeError, match="ha=True"):
                await store.try_acquire_lease("a", TTL_MS)
            with pytest.raises(RuntimeError, match="ha=True"):
                store.fence(1)
        finally:
            await store.close()
        with contextlib.closing(sqlite3.connect(path)) as raw:
            leases = raw.execute("SELECT count(*) FROM gcs_lease").fetchone()[0]
            changes = raw.execute("SELECT count(*) FROM gcs_changes").fetchone()[0]
        assert (leases, changes) == (0, 0)

    async def test_memory_without_ha_keeps_no_stream_and_refuses_ha_calls(self) -> None:
        """``memory://`` without --ha (the factory's default) records no changes; a
        MemoryStore built directly (tests, the in-process HA rig) does."""
        plain = store_from_url("memory://")
        assert isinstance(plain, MemoryStore)
        await plain.write(WriteBatch().put("KV", b"k", b"v"))
        with pytest.raises(RuntimeError, match="ha=False"):
            await plain.change_cursor()
        with pytest.raises(RuntimeError, match="ha=False"):
            await plain.try_acquire_lease("a", TTL_MS)
        with pytest.raises(RuntimeError, match="ha=False"):
            plain.fence(1)
        assert not plain._shared.changes
        ha = store_from_url("memory://", ha=True)
        assert isinstance(ha, MemoryStore)
        await ha.write(WriteBatch().put("KV", b"k", b"v"))
        assert await ha.change_cursor() == b"1"
        assert await MemoryStore().try_acquire_lease("a", TTL_MS) == 1

    async def test_redis_without_ha_warns_when_an_ha_leader_holds_the_namespace(
        self, redis_server: RedisServer
    ) -> None:
        """Opening a namespace whose lease is live without ha logs one warning naming the
        holder (it would bypass the fence and the standbys' stream)."""
        namespace = _namespace()
        leader = RedisStore(redis_server.url, namespace=namespace, ha=True)
        plain = RedisStore(redis_server.url, namespace=namespace)
        await leader.open()
        try:
            await leader.try_acquire_lease("gcs-1", TTL_MS)
            with capture_logs() as logs:
                await plain.open()
            warnings = [e for e in logs if e["event"] == "redis_ha_namespace_without_ha"]
            assert len(warnings) == 1 and warnings[0]["holder"] == "gcs-1"
        finally:
            await plain.close()
            await leader.close()

    async def test_redis_without_ha_opens_quietly_on_a_plain_namespace(
        self, redis_server: RedisServer
    ) -> None:
        """No lease, no warning."""
        plain = RedisStore(redis_server.url, namespace=_namespace(), options=RedisOptions())
        with capture_logs() as logs:
            await plain.open()
        await plain.close()
        assert not [e for e in logs if e["event"] == "redis_ha_namespace_without_ha"]
