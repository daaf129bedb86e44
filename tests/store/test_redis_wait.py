"""Replica acknowledgements (Redis WAIT): a write counts once a replica has it, or answers
"may have been applied"; nothing is claimed from state a replica has not confirmed."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from gcs.store import StoreOutcomeUnknown, StoreUnavailable, WriteBatch, write_definite
from gcs.store.redis.store import RedisOptions, RedisStore
from gcs.testing.redis_sentinels import RedisSentinels, redis_sentinels
from gcs.testing.redis_server import RedisServer, redis_info
from tests.conftest import eventually


def _waits(node: RedisServer) -> int:
    """How many WAIT commands the server has run."""
    with node.client() as client:
        stats = client.info("commandstats")
    return int(stats.get("cmdstat_wait", {}).get("calls", 0))


@pytest.fixture
def replicated() -> Iterator[RedisSentinels]:
    """A master with one replica in sync (no sentinels)."""
    with redis_sentinels(sentinels=0) as deployment:
        yield deployment


async def _store(url: str, **options: object) -> RedisStore:
    store = RedisStore(url, namespace=f"w{uuid.uuid4().hex[:8]}", options=RedisOptions(**options))  # type: ignore[arg-type]
    await store.open()
    return store


@pytest.fixture
async def closing() -> AsyncIterator[list[RedisStore]]:
    stores: list[RedisStore] = []
    yield stores
    for store in stores:
        await store.close()


class TestWaitTarget:
    """Who is waited for: by default one replica whenever the master has one."""

    async def test_writes_wait_for_a_replica_when_the_master_has_one(
        self, replicated: RedisSentinels, closing: list[RedisStore]
    ) -> None:
        """Default (auto): every batch and increment is followed by a WAIT; the replica has
        each write by the time it is acknowledged."""
        master, replica = replicated.nodes
        store = await _store(master.url, wait_timeout_ms=30_000)  # only bounds a hang
        closing.append(store)
        await store.put("KV", b"warm", b"up")  # loads the scripts (NOSCRIPT costs a round)
        await store.increment("c")
        before = _waits(master)
        for i in range(3):
            await store.put("KV", b"k%d" % i, b"v%d" % i)
            with replica.client() as raw:
                assert raw.hget(store._hash("KV"), b"k%d" % i) == b"v%d" % i
        await store.increment("c")
        assert _waits(master) - before == 4

    async def test_no_wait_on_a_master_without_replicas(
        self, redis_server: RedisServer, closing: list[RedisStore]
    ) -> None:
        """Auto on a lone server: no WAIT at all (the ordinary path stays as it was)."""
        store = await _store(redis_server.url)
        closing.append(store)
        before = _waits(redis_server)
        await store.put("KV", b"k", b"v")
        await store.increment("c")
        assert _waits(redis_server) == before

    async def test_zero_turns_waiting_off(
        self, replicated: RedisSentinels, closing: list[RedisStore]
    ) -> None:
        """wait_replicas=0: no WAIT even though a replica is there."""
        master = replicated.nodes[0]
        store = await _store(master.url, wait_replicas=0)
        closing.append(store)
        before = _waits(master)
        await store.put("KV", b"k", b"v")
        assert _waits(master) == before


class TestShortOfReplicas:
    """A replica that does not acknowledge in time makes every answer cautious."""

    async def test_unacknowledged_write_may_have_been_applied_until_the_replica_has_it(
        self, replicated: RedisSentinels, closing: list[RedisStore]
    ) -> None:
        """Replica paused: the write answers StoreOutcomeUnknown and landed() cannot tell
        yet; a failed create-if-absent is not reported as a conflict (the value it saw may
        not survive a failover) and an increment is refused.  Once the replica is back,
        landed() says the write landed and write_definite resolves a new one."""
        master, replica = replicated.nodes
        patient = await _store(master.url, wait_replicas=1, wait_timeout_ms=30_000)
        closing.append(patient)
        await patient.put("KV", b"taken", b"v")
        store = RedisStore(
            master.url,
            namespace=patient.namespace,
            options=RedisOptions(wait_replicas=1, wait_timeout_ms=200),
        )
        await store.open()
        closing.append(store)
        batch = WriteBatch().put("KV", b"k", b"v")
        replica.pause()
        try:
            with pytest.raises(StoreOutcomeUnknown, match="0 of 1 replicas"):
                await store.write(batch)
            with pytest.raises(StoreUnavailable, match="replicas"):
                await store.landed(batch.write_id)
            with pytest.raises(StoreUnavailable, match="nothing written"):
                await store.write(
                    WriteBatch().put("KV", b"taken", b"w").expect("KV", b"taken", None)
                )
            with pytest.raises(StoreUnavailable, match="replicas"):
                await store.increment("c")
        finally:
            replica.resume()
        assert await patient.landed(batch.write_id)
        assert await patient.get("KV", b"taken") == b"v"
        await write_definite(patient, WriteBatch().put("KV", b"k2", b"v"))

    async def test_auto_stops_waiting_once_the_master_has_no_replica(
        self, replicated: RedisSentinels, closing: list[RedisStore]
    ) -> None:
        """Replica killed: at most the write in flight falls short (and makes the store look
        again); then writes are acknowledged without WAIT."""
        master, replica = replicated.nodes
        store = await _store(master.url, wait_timeout_ms=200)
        closing.append(store)
        before = _waits(master)
        with contextlib.suppress(StoreOutcomeUnknown):  # 200 ms: short on a loaded machine
            await store.put("KV", b"k0", b"v")
        assert _waits(master) > before  # it waited: the master had a replica
        replica.stop(kill=True)
        await eventually(lambda: redis_info(master, "replication")["connected_slaves"] == "0")
        first = WriteBatch().put("KV", b"k1", b"v")
        # WAIT 1 with no replica left falls short, and the replica count is read again
        with contextlib.suppress(StoreOutcomeUnknown):
            await store.write(first)
        before = _waits(master)
        await store.put("KV", b"k2", b"v")
        assert _waits(master) == before
        assert await store.landed(first.write_id)
