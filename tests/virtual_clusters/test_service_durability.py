"""Restart replay on the same store (memory object reused / Redis) and store outages."""

from __future__ import annotations

import uuid

import grpc
import pytest

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID
from gcs.proto import virtual_cluster_pb2
from gcs.store.memory import MemoryStore
from gcs.store.redis.store import RedisStore
from tests.virtual_clusters.service_env import VcEnv

V = virtual_cluster_pb2


@pytest.fixture(params=["memory", "redis"])
async def durable_store(request):
    if request.param == "memory":
        yield MemoryStore()
        return
    redis = request.getfixturevalue("redis_server")
    store = RedisStore(redis.url, namespace=f"vc{uuid.uuid4().hex[:10]}")
    await store.open()
    yield store
    await store.close()


class TestRestart:
    async def test_restart_replays_layout_without_double_membership_or_older_revisions(
        self, durable_store
    ) -> None:
        """After a restart on the same store every cluster keeps its nodes and revision, no
        node is in two clusters, dead nodes stay dead, and new revisions are larger."""
        env = await VcEnv(durable_store).start()
        try:
            small = await env.add_nodes("4c8g", 4)
            await env.add_nodes("8c16g", 2, cpus=8)
            await env.create("div", {"4c8g": 2}, divisible=True)
            job = await env.vc.CreateJobCluster(
                V.CreateJobClusterRequest(
                    virtual_cluster_id="div", job_id="j1", replica_sets={"4c8g": 1}
                )
            )
            assert job.status.code == 0
            ind = await env.create("ind", {"4c8g": 1, "8c16g": 1})
            dead = next(n for n in ind.node_instances if n in small)
            await env.kill(dead)
            await env.manager.settle()  # the death's new revision of "ind" is stored
            before = await env.clusters()
            old = env.manager.registry
            high = max(old.revisions.last, *(c.revision for c in old.clusters()))

            await env.restart()
            registry = env.manager.registry
            assert registry.invariant_violations() == []
            after = await env.clusters()
            assert set(after) == {"div", "div##j1", "ind"}
            for cluster_id, data in before.items():
                assert set(after[cluster_id].node_instances) == set(data.node_instances)
                assert after[cluster_id].revision == data.revision
            assert registry.node(dead).is_dead
            assert registry.primary.revision > old.primary.revision
            again = await env.create("ind", {"4c8g": 1}, revision=after["ind"].revision)
            assert again.status.code == 0 and again.revision > high
            assert registry is env.manager.registry
        finally:
            await env.close()


class TestStoreOutage:
    async def test_write_failure_is_unavailable_and_memory_is_unchanged(self) -> None:
        """With the store failing writes a create is UNAVAILABLE; the registry and its
        generation are as before, and the same call succeeds once the store is back."""
        store = MemoryStore()
        env = await VcEnv(store).start()
        try:
            await env.add_nodes("4c8g", 2)
            registry = env.manager.registry
            before = (registry.generation, registry.records(), registry.primary)
            store.fail_writes = True
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await env.create("vc1", {"4c8g": 1})
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert (registry.generation, registry.records(), registry.primary) == before
            assert registry.get("vc1") is None
            store.fail_writes = False
            assert (await env.create("vc1", {"4c8g": 1})).status.code == 0
            assert registry.get(PRIMARY_CLUSTER_ID) is not None
        finally:
            await env.close()
