"""Builders for virtual-cluster model tests ("N/T" = N nodes round-robin over T templates)."""

from __future__ import annotations

import itertools

import pytest

from gcs.base.clock import FakeClock
from gcs.policy.virtual_clusters import NodeInstance, RevisionSource, VirtualClusterRegistry, replay
from gcs.policy.virtual_clusters.plan import CreateJobClusterResult, CreateOrUpdateResult, Plan
from gcs.policy.virtual_clusters.replay import ReplayOutcome
from gcs.proto.virtual_cluster_data_pb2 import VirtualClusterTableData


def nid(i: int) -> str:
    return f"{i:056x}"


class Harness:
    """A registry plus a fake store that applies every committed plan (like the lead will)."""

    def __init__(self, nodes: int = 0, templates: int = 1) -> None:
        ticks = itertools.count(1_000)
        self.now_ns = lambda: next(ticks)
        self.registry = VirtualClusterRegistry(RevisionSource(self.now_ns))
        self.store: dict[str, bytes] = {}
        self.published: list = []
        self.high_water = self.registry.revisions.last  # persisted at startup
        for i in range(nodes):
            self.join(nid(i), str(i % templates))

    def run(self, result: Plan | CreateOrUpdateResult | CreateJobClusterResult):
        plan = result if isinstance(result, Plan) else result.plan
        for key in plan.deletes:
            self.store.pop(key, None)
        for key, data in plan.puts.items():
            self.store[key] = data.SerializeToString(deterministic=True)
        self.registry.commit(plan)
        self.high_water = max(self.high_water, plan.revision_high_water)
        self.published.extend(plan.publishes)
        return result

    def join(self, node_id: str, template: str, hostname: str = "h") -> None:
        self.run(self.registry.add_node(NodeInstance(node_id, template, hostname)))

    def kill(self, node_id: str) -> None:
        self.run(self.registry.mark_node_dead(node_id))

    def create(self, cluster_id: str, replica_sets: dict[str, int], divisible: bool = True):
        return self.run(self.registry.create_or_update(cluster_id, divisible, replica_sets, 0))

    def update(self, cluster_id: str, replica_sets: dict[str, int], **kwargs):
        current = self.registry.get(cluster_id)
        assert current is not None
        return self.run(
            self.registry.create_or_update(
                cluster_id, current.divisible, replica_sets, current.revision, **kwargs
            )
        )

    def job(self, parent: str, job: str, replica_sets: dict[str, int]) -> str:
        return self.run(self.registry.create_job_cluster(parent, job, replica_sets)).job_cluster_id

    def counts(self, cluster_id: str, bucket: str | None = None) -> dict[str, int]:
        return self.registry.replica_sets(cluster_id, bucket)

    def alive(self, cluster_id: str) -> list[str]:
        cluster = self.registry.get(cluster_id)
        assert cluster is not None
        return sorted(n for n in cluster.members if not self.registry.node(n).is_dead)

    def node_table(self, drop: frozenset[str] = frozenset()) -> list[NodeInstance]:
        """The GCS node table as it would be stored (dropped rows: gone from the table)."""
        return [n for n in self.registry.nodes() if n.node_id not in drop]

    def restart(self, drop: frozenset[str] = frozenset(), clock_start: int = 0) -> ReplayOutcome:
        """Replay from the fake store and node table with a fresh (possibly earlier) clock."""
        ticks = itertools.count(clock_start)
        self.now_ns = lambda: next(ticks)
        records = [VirtualClusterTableData.FromString(b) for b in self.store.values()]
        outcome = replay(
            self.node_table(drop), records, RevisionSource(self.now_ns), self.high_water
        )
        for key in outcome.deletes:
            self.store.pop(key, None)
        for key, data in outcome.puts.items():
            self.store[key] = data.SerializeToString(deterministic=True)
        self.registry = outcome.registry
        self.high_water = outcome.revision_high_water
        return outcome

    def layout(self) -> dict[str, tuple[str, dict[str, str]]]:
        """Every non-primary cluster's kind and membership (for before/after comparisons)."""
        return {
            c.id: (c.kind.value, dict(c.members))
            for c in self.registry.clusters()
            if c.id != "kPrimaryClusterID"
        }

    def sound(self) -> None:
        assert self.registry.invariant_violations() == []


@pytest.fixture
def h200() -> Harness:
    return Harness(200, 10)


# --------------------------------------------------------------------------- gRPC-level
@pytest.fixture(params=["memory", "redis"])
async def vc_env(request):
    """A GCS (memory store, or a private Redis) with 3 nodes of type "4c8g" and 2 of "8c16g"."""
    import uuid

    from gcs.store.memory import MemoryStore
    from gcs.store.redis.store import RedisStore
    from tests.virtual_clusters.service_env import VcEnv

    if request.param == "memory":
        store = MemoryStore()
    else:
        redis = request.getfixturevalue("redis_server")
        store = RedisStore(redis.url, namespace=f"vc{uuid.uuid4().hex[:10]}")
        await store.open()
    env = await VcEnv(store).start()
    env.small = await env.add_nodes("4c8g", 3)
    env.large = await env.add_nodes("8c16g", 2, cpus=8)
    try:
        yield env
    finally:
        await env.close()
        if request.param == "redis":
            await store.close()


@pytest.fixture
async def memory_env():
    """Like ``vc_env`` on the memory store only."""
    from gcs.store.memory import MemoryStore
    from tests.virtual_clusters.service_env import VcEnv

    env = await VcEnv(MemoryStore(), clock=FakeClock()).start()
    env.small = await env.add_nodes("4c8g", 3)
    env.large = await env.add_nodes("8c16g", 2, cpus=8)
    try:
        yield env
    finally:
        await env.close()
