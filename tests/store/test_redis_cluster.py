"""Redis Cluster: every key of one GCS in one hash slot, the master of that slot followed
through MOVED, ASK and a failover, and the GCS serving and restarting on it.  (The store
contract suite runs on a cluster too: the ``redis_cluster`` backend in conftest.)"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import grpc
import pytest
from redis.crc import key_slot

from gcs.managers.kv import KvManager
from gcs.proto import gcs_service_pb2 as G
from gcs.server import GcsServer
from gcs.store import StoreUnavailable
from gcs.store.redis.cluster import Cluster, tagged_prefix
from gcs.store.redis.store import RedisOptions, RedisStore
from gcs.testing.linearizability import AckedWrites
from gcs.testing.redis_cluster import RedisCluster, redis_cluster
from gcs.testing.redis_server import RedisServer, redis_info
from tests.conftest import Stubs, fast_config


def _namespace() -> str:
    return f"c{uuid.uuid4().hex[:8]}"


def _cluster_of(store: RedisStore) -> Cluster:
    assert isinstance(store.topology, Cluster)
    return store.topology


class TestLayout:
    """Ray's layout with the prefix as a hash tag: ``{RAY<namespace>}@<TABLE>``."""

    @pytest.mark.parametrize("namespace", ["default", "", "a}b", "}x", "{", "ns-with-{tag}"])
    def test_every_key_of_a_namespace_hashes_to_one_slot(self, namespace: str) -> None:
        """Whatever the namespace holds (empty, braces), its tables, counters and markers
        share a slot, so no script is cross-slot."""
        prefix = tagged_prefix(namespace)
        names = [b"NODE", b"KV", b"GCS_META", b"JobCounter", b"__gcs_op:00ff", b"__gcs_inc:x"]
        assert len({key_slot(prefix + name) for name in names}) == 1

    async def test_tables_live_on_the_master_of_the_namespace_slot(
        self, cluster_deployment: RedisCluster
    ) -> None:
        """Detected from a plain redis:// URL of any node; NODE is the hash
        {RAY<ns>}@NODE on the master serving its slot."""
        ns = _namespace()
        async with RedisStore(cluster_deployment.url, namespace=ns) as store:
            await store.put("NODE", b"\x00node", b"info")
            assert await store.increment("JobCounter") == 1
            slot = _cluster_of(store).slot
        master = cluster_deployment.master_of(slot)
        with master.client() as raw:
            assert raw.hget(f"{{RAY{ns}}}@NODE", b"\x00node") == b"info"
            assert raw.get(f"{{RAY{ns}}}@JobCounter") == b"1"

    async def test_a_database_other_than_zero_is_refused(
        self, cluster_deployment: RedisCluster
    ) -> None:
        """A cluster has database 0 only: the error says so."""
        store = RedisStore(cluster_deployment.url.replace("/0", "/3"), namespace=_namespace())
        with pytest.raises(Exception, match="only database 0"):
            await store.open()


class TestRedirects:
    """The slot moves: ASK while its keys are in transit, MOVED once it has moved."""

    async def test_a_migrated_slot_is_followed(self, cluster_deployment: RedisCluster) -> None:
        """Keys moved to another master, slot still owned by the source: reads follow ASK
        (ASKING first); a write's script, which also creates its marker key, is refused with
        TRYAGAIN until the slot has moved (nothing written, a definite answer).  Slot handed
        over: the source answers MOVED and the store switches to the new master for good."""
        async with RedisStore(cluster_deployment.url, namespace=_namespace()) as store:
            await store.put("KV", b"before", b"1")
            cluster = _cluster_of(store)
            source = cluster_deployment.master_of(cluster.slot)
            target = next(n for n in cluster_deployment.nodes if n is not source and _is_master(n))
            cluster_deployment.start_migration(cluster.slot, target)
            assert await store.get("KV", b"before") == b"1"  # ASK: the key is on the target
            with pytest.raises(StoreUnavailable, match="TRYAGAIN"):
                await store.put("KV", b"during", b"2")
            assert cluster.master == source.address  # ASK does not move the slot
            cluster_deployment.finish_migration(cluster.slot, target)
            await store.put("KV", b"after", b"3")
            assert cluster.master == target.address  # MOVED does
            assert await store.get_all("KV") == {b"before": b"1", b"after": b"3"}
        with target.client() as raw:
            assert len(raw.hgetall(store._hash("KV"))) == 2


def _is_master(node: RedisServer) -> bool:
    return redis_info(node, "replication").get("role") == "master"


@pytest.fixture
def own_cluster() -> Iterator[RedisCluster]:
    """A cluster of its own (the test kills a master)."""
    with redis_cluster() as deployment:
        yield deployment


class TestFailover:
    async def test_writes_resume_on_the_promoted_replica_with_no_acknowledged_write_lost(
        self, own_cluster: RedisCluster
    ) -> None:
        """kill -9 of the slot's master mid-stream: writes fail definitely or "may have been
        applied" until a replica takes over, then go on through the same store; every
        acknowledged write is on the new master."""
        options = RedisOptions(socket_timeout_s=2.0, connect_timeout_s=1.0, wait_timeout_ms=5_000)
        async with RedisStore(own_cluster.url, namespace=_namespace(), options=options) as store:
            writes = AckedWrites(KvManager(store))
            slot = _cluster_of(store).slot
            old = own_cluster.master_of(slot)
            before = 0
            for i in itertools.count():
                if i == 100:
                    old.stop(kill=True)
                    before = len(writes.acked)
                if i > 100 and len(writes.acked) >= before + 100:
                    break
                await writes.write(i)
            new = own_cluster.master_of(slot)
            assert new.port != old.port and _cluster_of(store).master == new.address
            with new.client() as raw:
                lost = writes.lost(raw.hgetall(store._hash("KV")))
        assert not lost, f"{len(lost)} acknowledged writes lost ({writes.unknown} not acknowledged)"


class TestServing:
    """``gcs serve --storage redis://<cluster node>`` serves (it used to stop at start with
    "Keys in request don't hash to the same slot") and restarts onto the same state."""

    async def test_gcs_serves_and_restarts_on_a_cluster(
        self, cluster_deployment: RedisCluster
    ) -> None:
        config = fast_config(storage=cluster_deployment.url, namespace=_namespace())
        cluster_ids = []
        for round_ in range(2):
            server = GcsServer(config)
            await server.start()
            try:
                assert server.meta is not None
                cluster_ids.append(server.meta.cluster_id)
                async with grpc.aio.insecure_channel(server.address) as channel:
                    stubs = Stubs(channel, server.meta.cluster_id)
                    if round_ == 0:
                        await stubs.kv.InternalKVPut(
                            G.InternalKVPutRequest(namespace=b"n", key=b"k", value=b"v")
                        )
                    reply = await stubs.kv.InternalKVGet(
                        G.InternalKVGetRequest(namespace=b"n", key=b"k")
                    )
                    assert reply.value == b"v"
            finally:
                await server.stop()
        assert cluster_ids[0] == cluster_ids[1]
