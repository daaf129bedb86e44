"""The virtual-cluster registry: committed state plus one planner method per operation.

Every mutating method returns a ``Plan`` (or a result holding one) and changes nothing; the
caller persists ``plan.puts``/``plan.deletes`` atomically, then ``commit(plan)``, then publishes
``plan.publishes``. Failures raise ``VcError`` (code + exact ant-ray message) before any change.
Mutations must be serialised: ``commit`` rejects a plan built on an older generation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from gcs.policy.virtual_clusters import allocation, lifecycle, queries, replenish
from gcs.policy.virtual_clusters.convert import (
    ResourceLookup,
    autoscaler_state,
    to_table_data,
    to_view,
)
from gcs.policy.virtual_clusters.errors import StalePlan
from gcs.policy.virtual_clusters.ids import PRIMARY_CLUSTER_ID, UNDIVIDED
from gcs.policy.virtual_clusters.launchable import NO_AUTOSCALER, Launchable
from gcs.policy.virtual_clusters.model import (
    Cluster,
    Draft,
    Kind,
    NodeInstance,
    check_invariants,
    counted_members,
)
from gcs.policy.virtual_clusters.plan import (
    CreateJobClusterResult,
    CreateOrUpdateResult,
    Plan,
    PlanBuilder,
)
from gcs.policy.virtual_clusters.revision import RevisionSource
from gcs.policy.virtual_clusters.usage import IDLE, UsageView
from gcs.proto.autoscaler_pb2 import VirtualClusterState
from gcs.proto.virtual_cluster_data_pb2 import VirtualClusterTableData
from gcs.proto.virtual_cluster_pb2 import VirtualClusterView


class VirtualClusterRegistry:
    def __init__(
        self,
        revisions: RevisionSource,
        clusters: Mapping[str, Cluster] | None = None,
        nodes: Mapping[str, NodeInstance] | None = None,
    ) -> None:
        self.revisions = revisions
        self._clusters: dict[str, Cluster] = dict(clusters or {})
        self._nodes: dict[str, NodeInstance] = dict(nodes or {})
        if PRIMARY_CLUSTER_ID not in self._clusters:
            self._clusters[PRIMARY_CLUSTER_ID] = Cluster(
                id=PRIMARY_CLUSTER_ID, kind=Kind.PRIMARY, revision=revisions.next()
            )
        self.generation = 0

    # ------------------------------------------------------------------ state
    def draft(self) -> Draft:
        return Draft(self._clusters, self._nodes)

    def _builder(self) -> PlanBuilder:
        return PlanBuilder(self.draft(), self.generation, self.revisions)

    def commit(self, plan: Plan) -> None:
        if plan.base_generation != self.generation:
            raise StalePlan(f"plan of generation {plan.base_generation}, now {self.generation}")
        for cluster_id, cluster in plan.clusters.items():
            if cluster is None:
                self._clusters.pop(cluster_id, None)
            else:
                self._clusters[cluster_id] = cluster
        for node_id, node in plan.nodes.items():
            if node is None:
                self._nodes.pop(node_id, None)
            else:
                self._nodes[node_id] = node
        self.generation += 1

    # ------------------------------------------------------------------ reads
    def get(self, cluster_id: str) -> Cluster | None:
        return self._clusters.get(cluster_id)

    @property
    def primary(self) -> Cluster:
        return self._clusters[PRIMARY_CLUSTER_ID]

    def clusters(self) -> list[Cluster]:
        return self.draft().clusters()

    def node(self, node_id: str) -> NodeInstance | None:
        return self._nodes.get(node_id)

    def nodes(self) -> list[NodeInstance]:
        return list(self.draft().nodes())

    def replica_sets(self, cluster_id: str, bucket: str | None = None) -> dict[str, int]:
        cluster = self._clusters[cluster_id]
        return self.draft().replica_sets(cluster, bucket)

    def invariant_violations(self) -> list[str]:
        return check_invariants(self.draft())

    def table_data(self, cluster_id: str) -> VirtualClusterTableData:
        return to_table_data(self._clusters[cluster_id], self.node)

    def records(self) -> dict[str, VirtualClusterTableData]:
        """What storage should hold: every logical and job cluster (never the primary)."""
        return {
            c.id: to_table_data(c, self.node) for c in self.clusters() if c.kind is not Kind.PRIMARY
        }

    def get_virtual_clusters(
        self,
        cluster_id: str = "",
        include_job_clusters: bool = False,
        only_include_indivisible_clusters: bool = False,
    ) -> list[VirtualClusterTableData]:
        found = queries.get_virtual_clusters(
            self.draft(), cluster_id, include_job_clusters, only_include_indivisible_clusters
        )
        return [to_table_data(c, self.node) for c in found]

    def all_views(
        self, limit: int | None, resources: ResourceLookup
    ) -> tuple[list[VirtualClusterView], int]:
        found, total = queries.all_for_view(self.draft(), limit)
        return [to_view(c, self.node, resources) for c in found], total

    def node_counts(self) -> dict[str, tuple[int, int]]:
        """Cluster id -> (counted nodes, dead members still listed), every cluster: the
        counted ones are what ``all_views`` shows (:func:`counted_members`)."""
        out = {}
        for cluster in self.clusters():
            alive = len(counted_members(cluster, self.node))
            out[cluster.id] = (alive, len(cluster.members) - alive)
        return out

    def autoscaler_states(self) -> dict[str, VirtualClusterState]:
        """Every logical and job cluster plus the primary, keyed by id (reference §11)."""
        return {c.id: autoscaler_state(c, self.node) for c in self.clusters()}

    def get_autoscaling_config(self, cluster_id: str) -> Cluster:
        return allocation.get_autoscaling_config(self.draft(), cluster_id)

    def held_outside_primary(self, node_id: str) -> bool:
        """True when a logical cluster holds ``node_id`` (the primary's job clusters count)."""
        primary = self.primary
        if node_id in primary.members:
            return primary.members[node_id] != UNDIVIDED
        return self._nodes.get(node_id) is not None

    def nodes_in(self, cluster_id: str | None) -> frozenset[str] | None:
        return queries.nodes_in(self.draft(), cluster_id)

    def is_node_schedulable(self, cluster_id: str, node_id: str) -> bool:
        return queries.is_node_schedulable(self.draft(), cluster_id, node_id)

    def check_job_virtual_cluster(self, cluster_id: str) -> None:
        lifecycle.check_job_virtual_cluster(self.draft(), cluster_id)

    # ------------------------------------------------------------------ planners
    def _plan(self, step: Callable[[PlanBuilder], object]) -> Plan:
        builder = self._builder()
        step(builder)
        return builder.build()

    def add_node(self, node: NodeInstance) -> Plan:
        """A node joined: into the primary's undivided bucket. Idempotent (Q8 not copied);
        a known id (alive or dead) is left as is. Nothing to persist."""

        def step(b: PlanBuilder) -> None:
            if b.draft.node(node.node_id) is not None:
                return
            b.draft.put_node(node)
            if not node.is_dead:
                b.draft.put(
                    b.draft.primary().moved(
                        add={node.node_id: UNDIVIDED}, template=b.draft.template
                    )
                )

        return self._plan(step)

    def mark_node_dead(self, node_id: str) -> Plan:
        """The node stays where it is, dead, until replenishment. Nothing to persist: the
        clusters holding it get their new revision from :meth:`note_node_death`."""

        def step(b: PlanBuilder) -> None:
            node = b.draft.node(node_id)
            if node is not None and not node.is_dead:
                b.draft.put_node(
                    NodeInstance(node.node_id, node.template_id, node.hostname, is_dead=True)
                )

        return self._plan(step)

    def note_node_death(self, node_id: str) -> Plan:
        """A node of a logical or job cluster died (``mark_node_dead`` done): each cluster
        holding it gets a new revision, stored and published (the primary is left out)."""

        def step(b: PlanBuilder) -> None:
            for cluster in b.draft.clusters():
                if cluster.kind is not Kind.PRIMARY and node_id in cluster.members:
                    b.draft.put(cluster.moved(revision=self.revisions.next()))
                    b.flush(cluster.id)

        return self._plan(step)

    def create_or_update(
        self,
        cluster_id: str,
        divisible: bool,
        replica_sets: Mapping[str, int],
        revision: int = 0,
        usage: UsageView = IDLE,
        autoscaler: bool = False,
        *,
        must_exist: bool = False,
        launchable: Launchable = NO_AUTOSCALER,
    ) -> CreateOrUpdateResult:
        builder = self._builder()
        cluster = allocation.create_or_update(
            builder,
            self.revisions,
            usage,
            cluster_id,
            divisible=divisible,
            replica_sets=replica_sets,
            revision=revision,
            autoscaler=autoscaler,
            must_exist=must_exist,
            launchable=launchable,
        )
        draft = builder.draft
        nodes = {n: draft.node(n) for n in sorted(cluster.members)}
        return CreateOrUpdateResult(
            plan=builder.build(),
            revision=cluster.revision,
            cluster=cluster,
            node_instances={k: v for k, v in nodes.items() if v is not None},
        )

    def create_job_cluster(
        self, cluster_id: str, job_id: str, replica_sets: Mapping[str, int]
    ) -> CreateJobClusterResult:
        builder = self._builder()
        job_cluster_id = allocation.create_job_cluster(
            builder, self.revisions, cluster_id, job_id, replica_sets
        )
        return CreateJobClusterResult(plan=builder.build(), job_cluster_id=job_cluster_id)

    def remove(self, cluster_id: str, usage: UsageView = IDLE) -> Plan:
        return self._plan(lambda b: allocation.remove_cluster(b, self.revisions, usage, cluster_id))

    def remove_nodes(
        self,
        cluster_id: str,
        node_ids: Iterable[str],
        usage: UsageView = IDLE,
        *,
        revision: int = 0,
        autoscaler: bool = False,
    ) -> Plan:
        return self._plan(
            lambda b: allocation.remove_nodes(
                b,
                self.revisions,
                usage,
                cluster_id,
                node_ids,
                revision=revision,
                autoscaler=autoscaler,
            )
        )

    def update_autoscaling_config(
        self,
        cluster_id: str,
        min_replica_sets: Mapping[str, int],
        max_replica_sets: Mapping[str, int],
        max_nodes: int,
    ) -> Plan:
        return self._plan(
            lambda b: allocation.update_autoscaling_config(
                b, cluster_id, min_replica_sets, max_replica_sets, max_nodes
            )
        )

    def on_job_finished(self, cluster_id: str, usage: UsageView = IDLE) -> Plan:
        return self._plan(lambda b: lifecycle.on_job_finished(b, self.revisions, usage, cluster_id))

    def on_workload_gone(self, cluster_id: str, usage: UsageView = IDLE) -> Plan:
        """A detached actor/PG of ``cluster_id`` was destroyed: remove it if job-dead & idle."""
        return self._plan(
            lambda b: lifecycle.collect_expired(b, self.revisions, usage, only=cluster_id)
        )

    def collect_expired_job_clusters(self, usage: UsageView = IDLE) -> Plan:
        return self._plan(lambda b: lifecycle.collect_expired(b, self.revisions, usage))

    def replenish(self) -> Plan:
        return self._plan(replenish.replenish)
