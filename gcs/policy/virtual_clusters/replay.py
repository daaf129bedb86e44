"""GCS failover: rebuild the registry from the node table and the VIRTUAL_CLUSTER table.

Order (ant-ray ``PrimaryCluster.Initialize``): alive nodes into the primary; logical clusters;
repair divisible parents from their job clusters; then the job clusters. Differences from
ant-ray, all so that no node is in two clusters and none is lost:

* stored revisions are kept (quirk Q7 not copied) and the revision source is moved past the
  largest, so revisions never go backwards; only repaired clusters get a new revision;
* a node claimed by a second top-level cluster, or by two job clusters, stays with the first
  (ids in sorted order) and is dropped from the later record (a warning, and a Put);
* a job record whose parent is missing or indivisible is deleted instead of aborting;
* a job cluster's node missing from its parent is taken into the parent (from the primary,
  where such a node sits after a replenishment whose parent flush was lost) and the parent
  gives up as many dead undivided nodes of that template (best effort).

Repairs come back as puts/deletes to persist before serving; nothing is published.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from gcs.policy.virtual_clusters.convert import to_table_data
from gcs.policy.virtual_clusters.ids import (
    PRIMARY_CLUSTER_ID,
    UNDIVIDED,
    is_job_cluster_id,
    parent_id,
)
from gcs.policy.virtual_clusters.model import Cluster, Kind, NodeInstance
from gcs.policy.virtual_clusters.registry import VirtualClusterRegistry
from gcs.policy.virtual_clusters.revision import RevisionSource
from gcs.proto import virtual_cluster_data_pb2
from gcs.proto.virtual_cluster_data_pb2 import VirtualClusterTableData


@dataclass
class ReplayOutcome:
    registry: VirtualClusterRegistry
    puts: dict[str, VirtualClusterTableData] = field(default_factory=dict)
    deletes: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)
    revision_high_water: int = 0
    """Persist with ``puts``/``deletes`` (see ``Plan.revision_high_water``)."""


class _Replayer:
    def __init__(self, node_table: Iterable[NodeInstance], revisions: RevisionSource) -> None:
        self.revisions = revisions
        self.nodes: dict[str, NodeInstance] = {n.node_id: n for n in node_table}
        self.clusters: dict[str, Cluster] = {}
        self.owner: dict[str, str] = {}  # node id -> top-level cluster id
        self.changed: set[str] = set()
        self.outcome_warnings: list[str] = []
        self.deletes: set[str] = set()

    @property
    def primary_members(self) -> dict[str, str]:
        """The primary's members as a dict private to replay (mutated in place by ``_take``);
        after a ``moved`` (a shared ``Members``) it is copied back into one first."""
        primary = self.clusters[PRIMARY_CLUSTER_ID]
        if not isinstance(primary.members, dict):
            primary = replace(primary, members=dict(primary.members))
            self.clusters[PRIMARY_CLUSTER_ID] = primary
        assert isinstance(primary.members, dict)
        return primary.members

    def warn(self, text: str) -> None:
        self.outcome_warnings.append(text)

    def _know(self, node_id: str, instance: virtual_cluster_data_pb2.NodeInstance) -> None:
        """Record-only nodes (gone from the node table) are known but dead."""
        if node_id not in self.nodes:
            self.nodes[node_id] = NodeInstance(
                node_id, instance.template_id, instance.hostname, is_dead=True
            )

    def load_primary(self) -> None:
        # ids sorted alone (not (id, node) pairs): half the cost at 10,000 nodes
        alive = dict.fromkeys(
            sorted([n for n, node in self.nodes.items() if not node.is_dead]), UNDIVIDED
        )
        self.clusters[PRIMARY_CLUSTER_ID] = Cluster(
            id=PRIMARY_CLUSTER_ID, kind=Kind.PRIMARY, revision=0, members=alive
        )
        self.owner.update(dict.fromkeys(alive, PRIMARY_CLUSTER_ID))

    def _take(self, node_id: str, into: str) -> bool:
        """Move a node from the primary (or nowhere) to ``into``; False if owned elsewhere."""
        holder = self.owner.get(node_id)
        if holder not in (None, PRIMARY_CLUSTER_ID, into):
            return False
        if holder == PRIMARY_CLUSTER_ID and into != PRIMARY_CLUSTER_ID:
            # In place: copying the primary per node is O(nodes^2) at 10,000 nodes. The dict
            # belongs to the primary built by load_primary (or a later private copy), never
            # shared before replay returns.
            self.primary_members.pop(node_id, None)
        self.owner[node_id] = into
        return True

    def load_logical(self, record: VirtualClusterTableData) -> None:
        self.revisions.observe(record.revision)
        members: dict[str, str] = {}
        for node_id in sorted(record.node_instances):
            self._know(node_id, record.node_instances[node_id])
            if self._take(node_id, record.id):
                members[node_id] = UNDIVIDED
            else:
                self.warn(f"{node_id} of {record.id} already in {self.owner[node_id]}; dropped")
                self.changed.add(record.id)
        self.clusters[record.id] = Cluster(
            id=record.id,
            kind=Kind.DIVISIBLE if record.divisible else Kind.INDIVISIBLE,
            revision=record.revision,
            members=members,
            min_replica_sets=dict(record.min_replica_sets),
            max_replica_sets=dict(record.max_replica_sets),
            max_nodes=record.max_nodes,
            declared=dict(record.declared_replica_sets),
        )

    def _parent_of(self, record: VirtualClusterTableData) -> Cluster | None:
        parent = self.clusters.get(parent_id(record.id))
        if parent is None or parent.indivisible:
            self.warn(f"job cluster {record.id} has no divisible parent; deleted")
            self.deletes.add(record.id)
            return None
        return parent

    def repair_parent(self, record: VirtualClusterTableData, claimed: set[str]) -> None:
        """Take the job's nodes missing from its parent into the parent's undivided bucket."""
        parent = self._parent_of(record)
        if parent is None:
            return
        missing = [n for n in sorted(record.node_instances) if n not in parent.members]
        taken: list[str] = []
        for node_id in missing:
            self._know(node_id, record.node_instances[node_id])
            if self._take(node_id, parent.id):
                taken.append(node_id)
        if not taken:
            return
        surplus = Counter(self.nodes[n].template_id for n in taken)
        released: list[str] = []
        for node_id in parent.undivided():
            template = self.nodes[node_id].template_id
            dead = self.nodes[node_id].is_dead
            if dead and surplus[template] > 0 and node_id not in claimed:
                surplus[template] -= 1
                released.append(node_id)
                del self.owner[node_id]
        parent = parent.moved(add=dict.fromkeys(taken, UNDIVIDED), remove=released)
        self.clusters[parent.id] = parent
        if parent.kind is not Kind.PRIMARY:
            self.changed.add(parent.id)
        if parent.kind is not Kind.PRIMARY or any(not self.nodes[n].is_dead for n in taken):
            # Dead nodes lent to a primary job cluster are expected here: the primary is
            # rebuilt from ALIVE node-table rows only.
            self.warn(f"repaired {parent.id} from {record.id}: +{taken} -{released}")

    def load_job(self, record: VirtualClusterTableData) -> None:
        if record.id in self.deletes:
            return
        self.revisions.observe(record.revision)
        parent = self.clusters[parent_id(record.id)]
        members: dict[str, str] = {}
        for node_id in sorted(record.node_instances):
            if parent.members.get(node_id) == UNDIVIDED:
                members[node_id] = UNDIVIDED
            else:
                self.warn(f"{node_id} of {record.id} not free in {parent.id}; dropped")
                self.changed.add(record.id)
        self.clusters[parent.id] = parent.moved(add=dict.fromkeys(members, record.id))
        self.clusters[record.id] = Cluster(
            id=record.id, kind=Kind.JOB, revision=record.revision, members=members
        )


def replay(
    node_table: Iterable[NodeInstance],
    records: Iterable[VirtualClusterTableData],
    revisions: RevisionSource,
    revision_floor: int = 0,
) -> ReplayOutcome:
    """Rebuild from storage. ``node_table``: every node row (``is_dead`` = state DEAD);
    ``revision_floor``: the last persisted ``Plan.revision_high_water``.

    Afterwards the caller persists ``puts``/``deletes``, then tells the registry about jobs
    that are already finished (``on_job_finished``) and serves.
    """
    revisions.observe(revision_floor)
    replayer = _Replayer(node_table, revisions)
    replayer.load_primary()
    stored = sorted(records, key=lambda r: r.id)
    jobs = [r for r in stored if is_job_cluster_id(r.id)]
    for record in stored:
        if not is_job_cluster_id(record.id):
            replayer.load_logical(record)
    claimed = {n for r in jobs for n in r.node_instances}
    for record in jobs:
        replayer.repair_parent(record, claimed)
    for record in jobs:
        replayer.load_job(record)
    clusters = replayer.clusters
    for cluster_id in replayer.changed:
        if cluster_id in clusters and clusters[cluster_id].kind is not Kind.JOB:
            clusters[cluster_id] = clusters[cluster_id].moved(revision=revisions.next())
    clusters[PRIMARY_CLUSTER_ID] = clusters[PRIMARY_CLUSTER_ID].moved(revision=revisions.next())
    registry = VirtualClusterRegistry(revisions, clusters, replayer.nodes)
    puts = {
        cid: to_table_data(clusters[cid], registry.node)
        for cid in sorted(replayer.changed)
        if cid in clusters
    }
    return ReplayOutcome(
        registry, puts, replayer.deletes, replayer.outcome_warnings, revisions.last
    )
