"""Redis Sentinel: the store finds the master through a sentinel (Ray's way) or a list of
sentinels, and one GCS process rides a failover: writes resume on the new master, no
acknowledged write is lost, and the history of concurrent InternalKV clients stays
linearizable."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import uuid
from collections.abc import Iterator

import grpc
import pytest
from structlog.testing import capture_logs

from gcs.managers.kv import KvManager
from gcs.proto import gcs_service_pb2 as G
from gcs.server import GcsServer
from gcs.store import StoreError, StoreUnavailable
from gcs.store.redis.sentinel import parse_sentinel_url
from gcs.store.redis.store import RedisOptions, RedisStore
from gcs.store.redis.topology import TopologyError
from gcs.testing.linearizability import (
    AckedWrites,
    History,
    Workload,
    check,
    inject_lost_write,
    inject_second_winner,
    inject_stale_read,
)
from gcs.testing.redis_sentinels import RedisSentinels, redis_sentinels
from tests.conftest import Stubs, fast_config


@pytest.fixture
def sentinels() -> Iterator[RedisSentinels]:
    """A deployment of its own (tests here kill or demote its master)."""
    with redis_sentinels() as deployment:
        yield deployment


def _namespace() -> str:
    return f"s{uuid.uuid4().hex[:8]}"


class TestSentinelUrls:
    """``redis+sentinel://`` names sentinels, the master and the database."""

    def test_full_url_is_parsed(self) -> None:
        """Hosts with and without ports (26379 by default), master name, db, credentials."""
        parsed = parse_sentinel_url("redis+sentinel://u:p%40ss@h1:1,h2,[::1]:3/mymaster/2")
        assert parsed.sentinels == [("h1", 1), ("h2", 26379), ("::1", 3)]
        assert (parsed.service, parsed.db, parsed.ssl) == ("mymaster", 2, False)
        assert (parsed.username, parsed.password) == ("u", "p@ss")
        assert parse_sentinel_url("rediss+sentinel://h/m").ssl

    @pytest.mark.parametrize(
        ("url", "complaint"),
        [
            ("redis+sentinel:///m/0", "no sentinel address"),
            ("redis+sentinel://h1:26379", "master-name"),
            ("redis+sentinel://h1/m/0/extra", "master-name"),
            ("redis+sentinel://h1/m/zero", "not an integer"),
            ("redis+sentinel://h1:port/m", "bad sentinel address"),
        ],
    )
    def test_malformed_urls_are_refused_with_the_reason(self, url: str, complaint: str) -> None:
        with pytest.raises(TopologyError, match=complaint):
            parse_sentinel_url(url)

    def test_password_never_appears_in_the_complaint(self) -> None:
        with pytest.raises(TopologyError) as info:
            parse_sentinel_url("redis+sentinel://u:s3cret@h1/m/zero")
        assert "s3cret" not in str(info.value)


class TestFindingTheMaster:
    """Through a sentinel's address (as Ray takes it) or a list of sentinels."""

    async def test_a_sentinel_address_reaches_the_master_it_monitors(
        self, sentinel_deployment: RedisSentinels
    ) -> None:
        """redis://<sentinel>/0 talks to the master (not to the sentinel, which has no EVAL),
        and knows the other sentinels too."""
        ns = _namespace()
        async with RedisStore(sentinel_deployment.sentinel_url(1), namespace=ns) as store:
            await store.put("NODE", b"n", b"info")
            assert await store.increment("JobCounter") == 1
            assert store.topology is not None
            described = store.topology.describe()
        assert described["mode"] == "sentinel"
        assert described["master_name"] == sentinel_deployment.master_name
        assert len(described["sentinels"]) == 3
        with sentinel_deployment.master().client() as raw:
            assert raw.hget(f"RAY{ns}@NODE", b"n") == b"info"

    async def test_a_list_of_sentinels_with_one_down_still_finds_the_master(
        self, sentinels: RedisSentinels
    ) -> None:
        """The first sentinel of the list is dead: the next one answers."""
        dead = f"127.0.0.1:{sentinels.sentinel_ports[0]}"
        sentinels.stop_sentinel(0)
        assert dead in sentinels.url
        async with RedisStore(sentinels.url, namespace=_namespace()) as store:
            await store.put("KV", b"k", b"v")
            assert await store.get("KV", b"k") == b"v"

    async def test_a_sentinel_monitoring_several_masters_is_refused_by_name(
        self, sentinels: RedisSentinels
    ) -> None:
        """Ray needs exactly one master behind a sentinel address; the error names them and
        says how to pick one."""
        other = sentinels.nodes[1]  # any reachable server will do as a second "master"
        with sentinels.sentinel_client(0) as client:
            client.sentinel_monitor("second", "127.0.0.1", other.port, 2)
        store = RedisStore(sentinels.sentinel_url(0), namespace=_namespace())
        with pytest.raises(StoreError, match=r"2 masters \(gcs-master, second\).*redis\+sentinel"):
            await store.open()

    async def test_passwords_reach_master_and_sentinels(self) -> None:
        """requirepass on every node and sentinel: the URL's password, or Ray's
        --redis_password (RedisOptions.password) when the URL has none; none fails."""
        deployment = RedisSentinels(password="s3cret").start()
        try:
            bare = deployment.url.replace(":s3cret@", "")
            for url, options in [
                (deployment.url, RedisOptions()),
                (bare, RedisOptions(password="s3cret")),
                (
                    deployment.sentinel_url(2).replace(":s3cret@", ""),
                    RedisOptions(password="s3cret"),
                ),
            ]:
                async with RedisStore(url, namespace=_namespace(), options=options) as store:
                    await store.put("KV", b"k", b"v")
            store = RedisStore(bare, namespace=_namespace(), options=RedisOptions(retries=0))
            with pytest.raises(StoreUnavailable) as info:
                await store.open()
            assert "s3cret" not in str(info.value)
        finally:
            deployment.cleanup()


class TestFailover:
    """kill -9 of the master under concurrent writers; the same store carries on."""

    async def test_failover_under_writes_loses_no_acknowledged_write(
        self, sentinels: RedisSentinels
    ) -> None:
        """Eight InternalKV clients over hot keys plus a writer of unique keys; the master is
        killed mid-stream.  Writes in flight answer definitely or "may have been applied";
        after the sentinels promote the replica, writes resume through the same store;
        every acknowledged unique key is on the new master; the recorded history is
        linearizable, and each fault injected into it is found."""
        options = RedisOptions(socket_timeout_s=2.0, connect_timeout_s=1.0, wait_timeout_ms=5_000)
        store = RedisStore(sentinels.url, namespace=_namespace(), options=options)
        await store.open()
        kv = KvManager(store)
        history = History()
        old = sentinels.master()
        killed_at: int | None = None

        writes = AckedWrites(kv, failed_if=lambda e: isinstance(e, StoreUnavailable))
        acked_at_kill = 0

        def stop() -> bool:
            nonlocal killed_at, acked_at_kill
            if killed_at is None and len(history.operations) >= 300 and len(writes.acked) >= 20:
                old.stop(kill=True)
                killed_at, acked_at_kill = history.now(), len(writes.acked)
            return (
                killed_at is not None
                and _completed_after(history, killed_at) >= 300
                and len(writes.acked) >= acked_at_kill + 20
            )

        async def unique_writer() -> None:
            for i in itertools.count():
                if stop():
                    return
                await writes.write(i)

        workload = Workload(clients=8, keys=6, delete_keys=2, seed=7)
        try:
            await asyncio.gather(
                workload.run(
                    kv, history, stop=stop, failed_if=lambda e: isinstance(e, StoreUnavailable)
                ),
                unique_writer(),
            )
            await workload.read_back(kv, history)
            new = sentinels.master()
            assert new.port != old.port
            with new.client() as raw:
                lost = writes.lost(raw.hgetall(store._hash("KV")))
            assert not lost, f"{len(lost)} acknowledged writes lost: {lost[:5]}"
        finally:
            await store.close()
        ops = history.operations
        result = check(ops)
        assert result.ok, str(result)
        assert _completed_after(history, killed_at or 0) >= 300  # writes resumed
        for inject in (inject_stale_read, inject_second_winner, inject_lost_write):
            assert not check(inject(ops)).ok, inject.__name__

    async def test_a_switchover_loses_no_acknowledged_write(
        self, sentinels: RedisSentinels
    ) -> None:
        """SENTINEL FAILOVER while a writer runs: the old master keeps accepting writes for
        seconds after the replica was promoted (until the sentinels reconfigure it), but
        none of them is acknowledged: its WAIT falls short (its only replica left), the
        store asks the sentinels, finds the new master and carries on there."""
        options = RedisOptions(wait_timeout_ms=500)
        async with RedisStore(sentinels.url, namespace=_namespace(), options=options) as store:
            writes = AckedWrites(KvManager(store))
            old = sentinels.master()
            for i in itertools.count():
                if i == 30:  # a writer that has been running a while
                    with sentinels.sentinel_client(0) as client:
                        client.execute_command("SENTINEL FAILOVER", sentinels.master_name)
                    await asyncio.to_thread(sentinels.wait_for_new_master, old)
                if len(writes.acked) >= 60:
                    break
                await writes.write(i)
            new = sentinels.master()
            assert new.port != old.port
            with new.client() as raw:
                lost = writes.lost(raw.hgetall(store._hash("KV")))
        assert not lost, f"{len(lost)} acknowledged writes lost ({writes.unknown} not acknowledged)"


def _completed_after(history: History, tick: int) -> int:
    return sum(1 for op in history.operations if op.ret is not None and op.call > tick)


class TestServing:
    """``gcs serve --storage redis://<sentinel>:26379/0`` serves (it used to stop at start
    with "unknown command 'EVAL'")."""

    async def test_gcs_serves_with_a_sentinel_as_its_storage_address(
        self, sentinel_deployment: RedisSentinels
    ) -> None:
        server = GcsServer(
            fast_config(storage=sentinel_deployment.sentinel_url(0), namespace=_namespace())
        )
        await server.start()
        try:
            assert server.meta is not None
            async with grpc.aio.insecure_channel(server.address) as channel:
                stubs = Stubs(channel, server.meta.cluster_id)
                await stubs.kv.InternalKVPut(
                    G.InternalKVPutRequest(namespace=b"n", key=b"k", value=b"v", overwrite=True)
                )
                reply = await stubs.kv.InternalKVGet(
                    G.InternalKVGetRequest(namespace=b"n", key=b"k")
                )
            assert reply.value == b"v"
        finally:
            await server.stop()

    async def test_the_gcs_process_rides_a_failover(self, sentinels: RedisSentinels) -> None:
        """kill -9 of the master under a GCS taking InternalKV writes: calls in the gap fail
        as UNAVAILABLE, then the same server writes to the new master; no background loop
        fails and the data written before is still there."""
        options = dataclasses.replace(
            fast_config().redis, wait_timeout_ms=5_000
        )  # only bounds a hang
        server = GcsServer(
            fast_config(storage=sentinels.url, namespace=_namespace(), redis=options)
        )
        await server.start()
        try:
            assert server.meta is not None
            async with grpc.aio.insecure_channel(server.address) as channel:
                stubs = Stubs(channel, server.meta.cluster_id)
                put = G.InternalKVPutRequest(namespace=b"n", key=b"before", value=b"1")
                await stubs.kv.InternalKVPut(put)
                old = sentinels.master()
                with capture_logs() as logs:
                    old.stop(kill=True)
                    unavailable = 0
                    for i in itertools.count():
                        request = G.InternalKVPutRequest(
                            namespace=b"n", key=b"k%d" % i, value=b"v", overwrite=True
                        )
                        try:
                            await stubs.kv.InternalKVPut(request)
                            break
                        except grpc.aio.AioRpcError as err:
                            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
                            unavailable += 1
                    reply = await stubs.kv.InternalKVGet(
                        G.InternalKVGetRequest(namespace=b"n", key=b"before")
                    )
                assert reply.value == b"1"
                assert sentinels.master().port != old.port
                assert not [e for e in logs if e["event"] == "gcs.loop_failed"]
        finally:
            await server.stop()
