"""Builders for virtual-cluster model tests ("N/T" = N nodes round-robin over T templates)."""

from __future__ import annotations

import itertools

import pytest

from gcs.virtual_clusters import NodeInstance, RevisionSource, VirtualClusterRegistry
from gcs.virtual_clusters.plan import CreateJobClusterResult, CreateOrUpdateResult, Plan


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
        for i in range(nodes):
            self.join(nid(i), str(i % templates))

    def run(self, result: Plan | CreateOrUpdateResult | CreateJobClusterResult):
        plan = result if isinstance(result, Plan) else result.plan
        for key in plan.deletes:
            self.store.pop(key, None)
        for key, data in plan.puts.items():
            self.store[key] = data.SerializeToString()
        self.registry.commit(plan)
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

    def sound(self) -> None:
        assert self.registry.invariant_violations() == []


@pytest.fixture
def h200() -> Harness:
    return Harness(200, 10)
