"""Values of the virtual-cluster model: nodes, clusters, and a copy-on-write draft over them.

A ``Cluster`` maps each member node id to a bucket: ``UNDIVIDED`` ("NIL") or, inside the primary
or a divisible cluster, the id of the job cluster the node is lent to. Indivisible and job
clusters keep every node in ``UNDIVIDED``. The dead flag is a property of the node
(``NodeInstance.is_dead``), so a node marked dead is dead in its job cluster and parent alike.

Invariants (checked by ``check_invariants``): every known node sits in exactly one of the
primary or a logical cluster; a node in bucket ``J`` of its top-level cluster is a member of job
cluster ``J`` and vice versa.
"""

from __future__ import annotations

import enum
import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from gcs.policy.virtual_clusters.ids import PRIMARY_CLUSTER_ID, UNDIVIDED, parent_id
from gcs.policy.virtual_clusters.members import (
    Members,
    TemplateOf,
    UndividedIndex,
    build_index,
    moved_index,
)


@dataclass(frozen=True)
class NodeInstance:
    node_id: str
    """Hex node id (the wire key of ``node_instances``)."""
    template_id: str
    """The node's ``node_type_name``."""
    hostname: str = ""
    is_dead: bool = False


NodeView = NodeInstance
"""What the caller hands in for a node joining or replayed (``is_dead`` = not alive)."""


class Kind(enum.Enum):
    PRIMARY = "primary"
    DIVISIBLE = "divisible"
    INDIVISIBLE = "indivisible"
    JOB = "job"


@dataclass(frozen=True)
class Cluster:
    id: str
    kind: Kind
    revision: int
    members: Mapping[str, str] = field(default_factory=dict)
    """node id -> bucket (``UNDIVIDED`` or a job cluster id)."""
    min_replica_sets: Mapping[str, int] = field(default_factory=dict)
    max_replica_sets: Mapping[str, int] = field(default_factory=dict)
    max_nodes: int = 0
    job_dead: bool = False
    """Job clusters only: the job finished; remove once not in use (lazy destruction)."""
    declared: Mapping[str, int] = field(default_factory=dict)
    """Logical clusters: the replica sets the tenant last asked for (CreateOrUpdate, not the
    autoscaler's moves); with ``min_replica_sets`` they make the cluster's :func:`floor`."""

    @property
    def divisible(self) -> bool:
        return self.kind in (Kind.PRIMARY, Kind.DIVISIBLE)

    @property
    def indivisible(self) -> bool:
        return not self.divisible

    @property
    def parent_id(self) -> str:
        """The parent for job clusters, ``PRIMARY_CLUSTER_ID`` for logical, ``""`` for primary."""
        if self.kind is Kind.JOB:
            return parent_id(self.id)
        return "" if self.kind is Kind.PRIMARY else PRIMARY_CLUSTER_ID

    def undivided(self) -> list[str]:
        return sorted(n for n, b in self.members.items() if b == UNDIVIDED)

    def in_bucket(self, bucket: str) -> list[str]:
        return sorted(n for n, b in self.members.items() if b == bucket)

    _undivided: UndividedIndex | None = field(default=None, init=False, repr=False, compare=False)
    """Cache of ``undivided_index`` (not a value: ``replace`` drops it, it is rebuilt)."""

    def undivided_index(self, template: TemplateOf) -> UndividedIndex:
        """template -> undivided member ids (dead included); built once, then carried along
        by ``moved(template=...)``."""
        index = self._undivided
        if index is None:
            index = build_index(self.members, template)
            object.__setattr__(self, "_undivided", index)
        return index

    def moved(
        self,
        *,
        add: Mapping[str, str] | None = None,
        remove: Iterable[str] = (),
        revision: int | None = None,
        template: TemplateOf | None = None,
        declared: Mapping[str, int] | None = None,
    ) -> Cluster:
        """A new version with ``remove`` taken out, then ``add`` put in (and ``revision`` /
        ``declared`` when given). O(change) plus an amortised O(sqrt(size)) (``Members``);
        pass ``template`` (node id -> template) to keep the undivided index instead of having
        the next pick rebuild it."""
        add = add or {}
        removed = list(remove)
        changed = bool(add or removed)
        members = Members.of(self.members).moved(add, removed) if changed else self.members
        cluster = replace(
            self,
            members=members,
            revision=self.revision if revision is None else revision,
            declared=self.declared if declared is None else dict(declared),
        )
        index = self._undivided
        if changed and index is not None:
            index = (
                moved_index(index, self.members, members, [*removed, *add], template)
                if template is not None
                else None
            )
        object.__setattr__(cluster, "_undivided", index)
        return cluster


def floor(cluster: Cluster) -> dict[str, int]:
    """Per template, the nodes the autoscaler keeps in ``cluster`` (it neither releases below
    this nor leaves the cluster short of it): ``min_replica_sets`` where the autoscaling
    config names the template (it may allow less than declared, or ask for more), else the
    declared count.  Templates with a floor of 0 are left out."""
    merged = dict(cluster.declared)
    merged.update(cluster.min_replica_sets)
    return {t: n for t, n in sorted(merged.items()) if n > 0}


def counted_members(
    cluster: Cluster,
    node: Callable[[str], NodeInstance | None],
    *,
    undivided_only: bool = False,
) -> list[str]:
    """The members a cluster counts, sorted: known and alive (``undivided_only``: in the
    ``UNDIVIDED`` bucket too).  Dead members stay listed until replenished (ant-ray), but
    they run nothing; every count of a cluster's nodes -- ``GetAllVirtualClusterInfo``
    (``vcluster list``, ``status -v``), the autoscaler's view, the metrics -- is this one."""
    ids = cluster.undivided() if undivided_only else sorted(cluster.members)
    return [n for n in ids if (found := node(n)) is not None and not found.is_dead]


def same_membership(a: Cluster, b: Cluster) -> bool:
    """The same member nodes in the same buckets (an identity check first: ``moved``
    without a change keeps the members object)."""
    return a.members is b.members or dict(a.members) == dict(b.members)


class Draft:
    """A copy-on-write overlay on committed state: read like the state, write to the overlay.

    Every operation runs against a draft; the draft's overlay becomes a ``Plan``. Committed
    state is never touched before ``Registry.commit``.
    """

    def __init__(self, clusters: Mapping[str, Cluster], nodes: Mapping[str, NodeInstance]) -> None:
        self._base_clusters = clusters
        self._base_nodes = nodes
        self.cluster_changes: dict[str, Cluster | None] = {}
        self.node_changes: dict[str, NodeInstance | None] = {}

    # -- reads
    def committed(self, cluster_id: str) -> Cluster | None:
        """The cluster as committed, before this draft's changes."""
        return self._base_clusters.get(cluster_id)

    def get(self, cluster_id: str) -> Cluster | None:
        if cluster_id in self.cluster_changes:
            return self.cluster_changes[cluster_id]
        return self._base_clusters.get(cluster_id)

    def primary(self) -> Cluster:
        cluster = self.get(PRIMARY_CLUSTER_ID)
        assert cluster is not None
        return cluster

    def clusters(self) -> list[Cluster]:
        ids = set(self._base_clusters) | set(self.cluster_changes)
        found = (self.get(i) for i in sorted(ids))
        return [c for c in found if c is not None]

    def logical(self) -> list[Cluster]:
        return [c for c in self.clusters() if c.kind in (Kind.DIVISIBLE, Kind.INDIVISIBLE)]

    def jobs_of(self, parent: str) -> list[Cluster]:
        return [c for c in self.clusters() if c.kind is Kind.JOB and c.parent_id == parent]

    def node(self, node_id: str) -> NodeInstance | None:
        changes = self.node_changes
        if changes and node_id in changes:
            return changes[node_id]
        return self._base_nodes.get(node_id)

    def node_lookup(self) -> Callable[[str], NodeInstance | None]:
        """``node`` for a hot loop: the committed dict's ``get`` while no node changed."""
        return self.node if self.node_changes else self._base_nodes.get

    def nodes(self) -> Iterator[NodeInstance]:
        for node_id in sorted(set(self._base_nodes) | set(self.node_changes)):
            node = self.node(node_id)
            if node is not None:
                yield node

    def is_dead(self, node_id: str) -> bool:
        node = self.node(node_id)
        return node is None or node.is_dead

    def template(self, node_id: str) -> str:
        node = self.node(node_id)
        return node.template_id if node else ""

    def lowest_alive_undivided(self, cluster: Cluster, template: str, count: int) -> list[str]:
        """The ``count`` lowest alive undivided ids of ``template`` in ``cluster`` (fewer when
        there are not enough). Looks at that template's candidates only."""
        if count <= 0:
            return []
        candidates = cluster.undivided_index(self.template).get(template, frozenset())
        node = self.node_lookup()
        for want in (count, 4 * count + 32):
            picked = heapq.nsmallest(want, candidates)
            alive = [n for n in picked if (found := node(n)) is not None and not found.is_dead]
            if len(alive) >= count or len(picked) < want:
                return alive[:count]
        # Many dead among the lowest (the primary keeps its dead nodes): one sorted scan.
        alive = []
        for node_id in sorted(candidates):
            found = node(node_id)
            if found is not None and not found.is_dead:
                alive.append(node_id)
                if len(alive) == count:
                    break
        return alive

    def replica_sets(self, cluster: Cluster, bucket: str | None = None) -> dict[str, int]:
        """template -> count over all entries (dead included), optionally of one bucket."""
        return dict(
            Counter(self.template(n) for n, b in cluster.members.items() if bucket in (None, b))
        )

    # -- writes
    def put(self, cluster: Cluster) -> None:
        self.cluster_changes[cluster.id] = cluster

    def drop(self, cluster_id: str) -> None:
        self.cluster_changes[cluster_id] = None

    def put_node(self, node: NodeInstance) -> None:
        self.node_changes[node.node_id] = node


def check_invariants(draft: Draft) -> list[str]:
    """Violations of the model's invariants (empty when sound); used by tests and replay."""
    problems: list[str] = []
    seen: dict[str, str] = {}
    for cluster in draft.clusters():
        index = cluster._undivided
        if index is not None and index != build_index(cluster.members, draft.template):
            problems.append(f"{cluster.id}'s undivided index disagrees with its members")
        if cluster.kind is Kind.JOB:
            continue
        for node_id, bucket in cluster.members.items():
            if node_id in seen:
                problems.append(f"{node_id} in both {seen[node_id]} and {cluster.id}")
            seen[node_id] = cluster.id
            if draft.node(node_id) is None:
                problems.append(f"{node_id} in {cluster.id} is unknown")
            if bucket != UNDIVIDED:
                job = draft.get(bucket)
                if cluster.indivisible or job is None or job.parent_id != cluster.id:
                    problems.append(f"{node_id} in {cluster.id} lent to missing job {bucket}")
                elif node_id not in job.members:
                    problems.append(f"{node_id} lent to {bucket} but not in it")
    for job in draft.clusters():
        if job.kind is not Kind.JOB:
            continue
        parent = draft.get(job.parent_id)
        if parent is None or parent.indivisible:
            problems.append(f"job cluster {job.id} has no divisible parent")
            continue
        for node_id in job.members:
            if parent.members.get(node_id) != job.id:
                problems.append(f"{node_id} of {job.id} not in its parent's bucket")
    for node in draft.nodes():
        if not node.is_dead and node.node_id not in seen:
            problems.append(f"alive node {node.node_id} is in no cluster")
    return problems
