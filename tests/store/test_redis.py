"""Redis backend specifics: Ray's key layout, retry safety, timeouts, crash durability."""

from __future__ import annotations

import asyncio
import pathlib
import socket
import time
import uuid
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from gcs.store import StoreOutcomeUnknown, StoreUnavailable, WriteBatch
from gcs.store.redis.store import RedisOptions, RedisStore
from gcs.testing.ports import free_port
from gcs.testing.redis_server import RedisServer


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a hung Redis)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


class TestLayout:
    """Data sits where Ray 2.60 puts it, so Ray's tooling can read it."""

    async def test_tables_are_hashes_and_counters_are_strings(
        self, redis_server: RedisServer
    ) -> None:
        """NODE lives in hash RAY<ns>@NODE with the raw key as field; JobCounter is a string."""
        ns = f"ns{uuid.uuid4().hex[:8]}"
        async with RedisStore(redis_server.url, namespace=ns) as store:
            await store.put("NODE", b"\x00node\xff", b"info")
            await store.increment("JobCounter")
        raw = Redis.from_url(redis_server.url)
        try:
            assert await raw.hget(f"RAY{ns}@NODE", b"\x00node\xff") == b"info"  # type: ignore[misc]
            assert await raw.get(f"RAY{ns}@JobCounter") == b"1"
        finally:
            await raw.aclose()

    def test_namespace_with_at_sign_is_rejected(self) -> None:
        """'@' would make RAY<ns>@<TABLE> ambiguous, as in Ray."""
        with pytest.raises(ValueError, match="@"):
            RedisStore("redis://127.0.0.1:1/0", namespace="a@b")


class TestRetrySafety:
    """A write retried after its first attempt landed is applied once."""

    async def test_replayed_conditional_batch_is_not_a_conflict(
        self, redis_server: RedisServer
    ) -> None:
        """Replaying a create-if-absent with the same write id reports success, once."""
        async with RedisStore(redis_server.url, namespace=uuid.uuid4().hex) as store:
            batch = WriteBatch().put("KV", b"k", b"v").expect("KV", b"k", None)
            await store.write(batch)
            await store.write(batch)  # what redis-py's retry does after a lost reply
            assert await store.get("KV", b"k") == b"v"

    async def test_replayed_increment_counts_once(self, redis_server: RedisServer) -> None:
        """Replaying an increment with the same op token returns the same value."""
        async with RedisStore(redis_server.url, namespace=uuid.uuid4().hex) as store:
            token = store._increment_marker()
            store._increment_marker = lambda: token  # type: ignore[method-assign]
            assert await store.increment("c") == 1
            assert await store.increment("c") == 1
            assert await store.read_counter("c") == 1


class TestTimeouts:
    """A Redis that never answers cannot hang the caller."""

    async def test_hung_server_fails_open_within_the_socket_timeouts(
        self, silent_port: int
    ) -> None:
        """open() against a silent port raises StoreUnavailable after bounded time."""
        options = RedisOptions(socket_timeout_s=0.2, connect_timeout_s=0.2, retries=1)
        store = RedisStore(f"redis://127.0.0.1:{silent_port}/0", options=options)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.open()
        # ~0.5 s of timeouts and backoff; the bound only tells "gave up" from "hung", with
        # room for a loaded machine (-n 4 on 2 cores) where the loop itself runs late
        assert time.monotonic() - started < 15.0


class TestCrashDurability:
    """With appendfsync always, every acknowledged write survives kill -9 of Redis."""

    async def test_acknowledged_writes_survive_sigkill(self) -> None:
        """Writers under load; Redis is SIGKILLed mid-stream; after restart every write that
        returned is present, every acknowledged counter value is covered, a write refused as
        StoreUnavailable is absent, and one left StoreOutcomeUnknown (killed after it may have
        been fsynced) is resolved by landed() to what the store holds."""
        server = RedisServer(appendfsync="always").start()
        options = RedisOptions(socket_timeout_s=1.0, connect_timeout_s=0.5, retries=0)
        store = RedisStore(server.url, namespace="crash", options=options)
        await store.open()
        acked: list[bytes] = []
        refused: list[bytes] = []
        unknown: list[tuple[bytes, bytes]] = []
        top_counter = 0
        enough = asyncio.Event()

        async def writer(worker: int) -> None:
            nonlocal top_counter
            for i in range(100_000):
                key = f"{worker}-{i}".encode()
                batch = WriteBatch().put("KV", key, key).put("NODE", key, b"n")
                try:
                    await store.write(batch)
                except StoreUnavailable:
                    refused.append(key)
                    return
                except StoreOutcomeUnknown:
                    unknown.append((key, batch.write_id))
                    return
                try:
                    top_counter = max(top_counter, await store.increment("c"))
                except StoreUnavailable:
                    acked.append(key)
                    return
                acked.append(key)
                if len(acked) >= 300:
                    enough.set()

        tasks = [asyncio.create_task(writer(w)) for w in range(4)]
        await enough.wait()
        server.stop(kill=True)
        await asyncio.gather(*tasks)
        try:
            server.start()
            kv = await store.get_all("KV")
            nodes = await store.get_all("NODE")
            assert all(kv.get(k) == k and k in nodes for k in acked)
            assert await store.read_counter("c") >= top_counter
            assert not any(k in kv or k in nodes for k in refused)
            for key, write_id in unknown:
                assert await store.landed(write_id) == (key in kv) == (key in nodes)
        finally:
            await store.close()
            server.cleanup()


class TestDurabilityWarning:
    """open() warns when Redis would lose acknowledged writes in a crash."""

    async def test_warns_when_appendfsync_is_not_always(self) -> None:
        """appendfsync everysec → one 'redis_not_durable' warning naming the settings."""
        server = RedisServer(appendfsync="everysec").start()
        try:
            with capture_logs() as logs:
                async with RedisStore(server.url, namespace="w"):
                    pass
        finally:
            server.cleanup()
        warnings = [e for e in logs if e["event"] == "redis_not_durable"]
        assert len(warnings) == 1
        assert warnings[0]["appendfsync"] == "everysec"

    async def test_stays_quiet_when_settings_are_durable(self, redis_server: RedisServer) -> None:
        """appendonly yes + appendfsync always → no warning."""
        with capture_logs() as logs:
            async with RedisStore(redis_server.url, namespace="q"):
                pass
        assert [e for e in logs if e["event"] == "redis_not_durable"] == []


class TestErrorMessages:
    """Errors name the server but never its password."""

    async def test_unavailable_error_hides_the_password(self) -> None:
        """A refused connection's message shows the URL with the password masked."""
        options = RedisOptions(connect_timeout_s=0.2, retries=0)
        port = free_port()
        store = RedisStore(f"redis://user:s3cret@127.0.0.1:{port}/0", options=options)
        with pytest.raises(StoreUnavailable) as info:
            await store.open()
        assert "s3cret" not in str(info.value)
        assert f"redis://user:***@127.0.0.1:{port}/0" in str(info.value)


class TestRefusedReplies:
    """Replies of a command Redis did not run mean "nothing written", not a script bug."""

    async def test_a_write_to_a_demoted_master_is_unavailable(self) -> None:
        """The server became a replica (as an old master does after a failover): its
        READONLY reply is StoreUnavailable (definite), with the code named; reads still work."""
        master = RedisServer().start()
        other = RedisServer().start()
        try:
            options = RedisOptions(retries=1, backoff_base_s=0.01)
            async with RedisStore(other.url, namespace="ro", options=options) as store:
                await store.put("KV", b"k", b"v")
                with other.client() as raw:
                    raw.execute_command("REPLICAOF", "127.0.0.1", master.port)
                with pytest.raises(StoreUnavailable, match="READONLY"):
                    await store.write(WriteBatch().put("KV", b"k2", b"v"))
                with pytest.raises(StoreUnavailable, match="READONLY"):
                    await store.increment("c")
        finally:
            master.cleanup()
            other.cleanup()


class TestUnixSocket:
    async def test_a_unix_socket_url_is_probed_and_served(self, tmp_path: pathlib.Path) -> None:
        """unix:///path?db=N: the probe (database 0) and the store (database N) both use
        the socket."""
        sock = tmp_path / "redis.sock"
        server = RedisServer(extra_args=("--unixsocket", str(sock))).start()
        try:
            async with RedisStore(f"unix://{sock}?db=2", namespace="u") as store:
                await store.put("KV", b"k", b"v")
                assert await store.get("KV", b"k") == b"v"
            with server.client() as raw:
                raw.select(2)
                assert raw.hget("RAYu@KV", b"k") == b"v"
        finally:
            server.cleanup()
