"""Plans: the full change set of one operation, computed before anything is applied.

Caller protocol (one mutation at a time, e.g. under an asyncio.Lock):

    plan = registry.create_or_update(...)        # raises VcError: nothing changed
    await store.write(puts=plan.puts, deletes=plan.deletes)   # one atomic batch
    registry.commit(plan)                        # raises StalePlan if the registry moved on
    for message in plan.publishes: publish(RAY_VIRTUAL_CLUSTER_CHANNEL, message.id, message)

If the write fails, drop the plan: the registry is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gcs.policy.virtual_clusters.convert import to_table_data
from gcs.policy.virtual_clusters.model import Cluster, Draft, Kind, NodeInstance, same_membership
from gcs.policy.virtual_clusters.revision import RevisionSource
from gcs.proto.virtual_cluster_data_pb2 import VirtualClusterTableData


@dataclass(frozen=True)
class Plan:
    base_generation: int
    clusters: Mapping[str, Cluster | None] = field(default_factory=dict)
    """New value per changed cluster id; ``None`` = removed."""
    nodes: Mapping[str, NodeInstance | None] = field(default_factory=dict)
    puts: Mapping[str, VirtualClusterTableData] = field(default_factory=dict)
    """Storage Put, table VIRTUAL_CLUSTER, key = cluster id."""
    deletes: frozenset[str] = frozenset()
    """Storage Delete, same table."""
    publishes: tuple[VirtualClusterTableData, ...] = ()
    """Publish each on RAY_VIRTUAL_CLUSTER_CHANNEL (key_id = id bytes) after commit."""
    revision_high_water: int = 0
    """The largest revision handed out so far. Persist it with the batch (e.g. a durable
    counter) and pass it to ``replay(revision_floor=...)``: the primary is never stored, so
    this is what keeps its revision from going backwards across a restart."""

    @property
    def empty(self) -> bool:
        return not (self.clusters or self.nodes)


@dataclass(frozen=True)
class CreateOrUpdateResult:
    plan: Plan
    revision: int
    cluster: Cluster
    node_instances: Mapping[str, NodeInstance]
    """Every node of the cluster after the change (reply ``node_instances``)."""


@dataclass(frozen=True)
class CreateJobClusterResult:
    plan: Plan
    job_cluster_id: str


class PlanBuilder:
    """A draft plus which clusters to flush (persist, and publish when indivisible)."""

    def __init__(self, draft: Draft, generation: int, revisions: RevisionSource) -> None:
        self.draft = draft
        self.generation = generation
        self.revisions = revisions
        self._flush: list[str] = []
        self._removed: dict[str, Cluster] = {}

    def flush(self, cluster_id: str) -> None:
        if cluster_id not in self._flush:
            self._flush.append(cluster_id)

    def flush_removed(self, cluster: Cluster) -> None:
        self._removed[cluster.id] = cluster

    def _revise_changed(self) -> None:
        """Every cluster whose nodes or declared replica sets this operation changed gets a
        new revision (unless the operation gave it one) and is flushed: a client's update at
        the old revision must fail, whatever moved the nodes (release, replenishment, ...).
        The primary is left out: never stored, never updated by clients."""
        draft = self.draft
        for cluster_id, cluster in list(draft.cluster_changes.items()):
            if cluster is None or cluster.kind is Kind.PRIMARY:
                continue
            base = draft.committed(cluster_id)
            if base is None or base.revision != cluster.revision:
                continue  # new, or revised by the operation itself
            if same_membership(base, cluster) and base.declared == cluster.declared:
                continue
            draft.put(cluster.moved(revision=self.revisions.next()))
            self.flush(cluster_id)

    def build(self) -> Plan:
        self._revise_changed()
        draft = self.draft
        puts: dict[str, VirtualClusterTableData] = {}
        publishes: list[VirtualClusterTableData] = []
        for cluster_id in self._flush:
            cluster = draft.get(cluster_id)
            if cluster is None or cluster.kind is Kind.PRIMARY:
                continue  # the primary is never persisted or published
            data = to_table_data(cluster, draft.node)
            puts[cluster_id] = data
            if cluster.indivisible:
                publishes.append(data)
        for cluster in self._removed.values():
            if cluster.indivisible:
                publishes.append(to_table_data(cluster, draft.node, is_removed=True))
        return Plan(
            base_generation=self.generation,
            clusters=dict(draft.cluster_changes),
            nodes=dict(draft.node_changes),
            puts=puts,
            deletes=frozenset(self._removed),
            publishes=tuple(publishes),
            revision_high_water=self.revisions.last,
        )
