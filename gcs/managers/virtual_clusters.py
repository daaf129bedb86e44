"""Virtual clusters in the running GCS: owns the registry and does its I/O.

Every mutation follows the model's protocol on the manager's
:class:`~gcs.managers.lane.ApplyLane`: plan (``VcError`` = nothing changed) -> one atomic
``WriteBatch`` (``plan.puts``/``plan.deletes`` on table VIRTUAL_CLUSTER plus the revision
high-water mark in GCS_META) -> ``registry.commit`` -> publish ``plan.publishes`` on channel
11.  A write that certainly failed drops the plan (memory unchanged, UNAVAILABLE); an
ambiguous one is resolved by the lane (now, or before the next mutation).

Node events come from the node fan-out (:mod:`gcs.managers.events`) after the node row is
persisted.  The node's own change (joined the primary, marked dead) has nothing to persist,
so it commits synchronously; while a mutation holds the lane (or its write is still
unresolved) it is queued and applied after it (its plan was built before them and commits
first).  A death inside a logical or job cluster then takes the lane like any mutation: the
clusters holding the node get a new revision, stored and published.  Events before
:meth:`load` are ignored: the replay reads the loaded node table itself.

Workload (``UsageView``) is read from the live GCS: a node is idle when the resource view
says so; a cluster has workload while a running job or a detached, not removed placement
group is registered in it (PG ids are resolved to the creator job's cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import structlog

from gcs.base.background import Background
from gcs.base.clock import Clock
from gcs.base.errors import Unavailable
from gcs.base.protowire import len_field, string_field
from gcs.base.pubsub_channels import RAY_VIRTUAL_CLUSTER_CHANNEL
from gcs.managers.events import Prepared
from gcs.managers.jobs import JobManager, JobRejected
from gcs.managers.lane import ApplyLane, ResolvePolicy
from gcs.managers.nodes import NodeManager
from gcs.managers.placement_groups import PlacementGroupManager, gang_request
from gcs.managers.resources import ResourceCache
from gcs.policy.virtual_clusters import (
    CreateJobClusterResult,
    CreateOrUpdateResult,
    Plan,
    RevisionSource,
    VcError,
    VirtualClusterRegistry,
    replay,
)
from gcs.policy.virtual_clusters.convert import node_view_from_gcs_node_info
from gcs.policy.virtual_clusters.ids import PRIMARY_CLUSTER_ID, is_job_cluster_id
from gcs.policy.virtual_clusters.launchable import NO_AUTOSCALER, Launchable
from gcs.policy.virtual_clusters.model import Cluster
from gcs.proto import autoscaler_pb2, gcs_pb2
from gcs.proto.virtual_cluster_data_pb2 import VirtualClusterTableData
from gcs.store import Store, StoreError, WriteBatch
from gcs.store.base import TABLE_META, TABLE_NODE, TABLE_VIRTUAL_CLUSTER

log = structlog.get_logger("gcs.policy.virtual_clusters")

HIGH_WATER_KEY = b"virtual_cluster_revision_high_water"
PG = gcs_pb2.PlacementGroupTableData
Publish = Callable[[int, bytes, VirtualClusterTableData], object]
R = TypeVar("R", Plan, CreateOrUpdateResult, CreateJobClusterResult)


def _no_publish(channel: int, key_id: bytes, message: VirtualClusterTableData) -> None:
    return None


class LiveUsage:
    """``UsageView`` over the GCS's current state; built per operation. Workload is indexed
    on the first ``has_workload`` (O(jobs + PGs), which include finished ones), so operations
    that only ask about nodes, like CreateOrUpdate, never pay for it."""

    def __init__(
        self, resources: ResourceCache, jobs: JobManager, pgs: PlacementGroupManager
    ) -> None:
        self._resources = resources
        self._jobs = jobs
        self._pgs = pgs
        self._busy: set[str] | None = None

    def is_node_idle(self, node_id: str) -> bool:
        return self._resources.is_idle(bytes.fromhex(node_id))

    def has_workload(self, cluster_id: str) -> bool:
        if self._busy is None:
            self._busy = self._busy_clusters()
        return cluster_id in self._busy

    def _busy_clusters(self) -> set[str]:
        busy = {j.virtual_cluster_id for j in self._jobs.jobs.values() if not j.is_dead}
        for pg_id, vc_id in self._pgs.virtual_cluster_of.items():
            pg = self._pgs.groups.get(pg_id)
            if pg is not None and pg.is_detached and pg.state != PG.REMOVED:
                busy.add(vc_id)
        busy.discard("")
        return busy


@dataclass(frozen=True, slots=True)
class _NodeEvent:
    node: gcs_pb2.GcsNodeInfo
    dead: bool


class VirtualClusterManager:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        nodes: NodeManager,
        jobs: JobManager,
        pgs: PlacementGroupManager,
        resources: ResourceCache,
        *,
        publish: Publish = _no_publish,
        lane_policy: ResolvePolicy | None = None,
        launchable: Launchable = NO_AUTOSCALER,
    ) -> None:
        """``launchable``: the embedded autoscaler's limits (a tenant's indivisible cluster
        may wait for nodes it can launch), ``NO_AUTOSCALER`` when none runs."""
        self._store = store
        self._clock = clock
        self._nodes = nodes
        self._jobs = jobs
        self._pgs = pgs
        self._resources = resources
        self._publish = publish
        self._launchable = launchable
        self._lane = ApplyLane(store, "virtual_clusters", clock, policy=lane_policy)
        self._loaded = False
        self._queued: list[_NodeEvent] = []
        self._background = Background("virtual_clusters")
        self.registry = VirtualClusterRegistry(RevisionSource(self._now_ns))
        self._section_key: tuple[int, int, int, int] | None = None
        self._section = b""

    def _now_ns(self) -> int:
        return int(self._clock.now_s() * 1_000_000_000)

    def usage(self) -> LiveUsage:
        return LiveUsage(self._resources, self._jobs, self._pgs)

    # -- startup -------------------------------------------------------------------------
    def _finish_job_cluster(self, cluster_id: str) -> Plan:
        return self.registry.on_job_finished(cluster_id, self.usage())

    async def load(self) -> None:
        """Replay after NodeManager/JobManager/PlacementGroupManager loaded; persist repairs;
        then finish job clusters whose job is already dead. Publishes nothing."""
        rows = await self._store.get_all(TABLE_VIRTUAL_CLUSTER)
        records = [VirtualClusterTableData.FromString(raw) for raw in rows.values()]
        raw_floor = await self._store.get(TABLE_META, HIGH_WATER_KEY)
        floor = int(raw_floor) if raw_floor else 0
        # views a hot standby built as the node rows arrived (else built here)
        nodes = self._nodes
        node_table = self._store.prepared(
            TABLE_NODE,
            node_view_from_gcs_node_info,
            itertools.chain(nodes.alive.items(), nodes.dead.items()),
        ).values()
        outcome = replay(node_table, records, RevisionSource(self._now_ns), revision_floor=floor)
        for warning in outcome.warnings:
            log.warning("virtual_clusters.replay_repair", detail=warning)
        batch = WriteBatch()
        for cluster_id, data in outcome.puts.items():
            batch.put(TABLE_VIRTUAL_CLUSTER, cluster_id.encode(), data.SerializeToString())
        for cluster_id in outcome.deletes:
            batch.delete(TABLE_VIRTUAL_CLUSTER, cluster_id.encode())
        batch.put(TABLE_META, HIGH_WATER_KEY, str(outcome.revision_high_water).encode())

        def apply() -> None:
            self.registry = outcome.registry
            self._loaded = True

        async with self._lane:
            await self._lane.commit(batch, apply)
        dead_jobs = sorted(
            j.virtual_cluster_id
            for j in self._jobs.jobs.values()
            if j.is_dead and is_job_cluster_id(j.virtual_cluster_id)
        )
        for cluster_id in dead_jobs:
            if self.registry.get(cluster_id) is not None:
                await self._run(
                    functools.partial(self._finish_job_cluster, cluster_id)  # type: ignore[arg-type]
                )
        log.info(
            "virtual_clusters.loaded",
            clusters=len(records),
            repaired=len(outcome.puts),
            deleted=len(outcome.deletes),
        )

    # -- the mutation protocol -----------------------------------------------------------
    async def _run(self, make: Callable[[], R], *, publish: bool = True) -> R:
        async with self._exclusive():
            result = make()
            plan = result if isinstance(result, Plan) else result.plan

            def apply() -> None:
                self.registry.commit(plan)
                if publish:
                    for data in plan.publishes:
                        self._publish(RAY_VIRTUAL_CLUSTER_CHANNEL, data.id.encode(), data)

            await self._lane.commit(self._batch(plan), apply)
            return result

    @staticmethod
    def _batch(plan: Plan) -> WriteBatch:
        """The plan's rows plus the revision high-water mark; empty when nothing to store."""
        batch = WriteBatch()
        if not (plan.puts or plan.deletes):
            return batch
        for cluster_id, data in plan.puts.items():
            batch.put(TABLE_VIRTUAL_CLUSTER, cluster_id.encode(), data.SerializeToString())
        for cluster_id in plan.deletes:
            batch.delete(TABLE_VIRTUAL_CLUSTER, cluster_id.encode())
        batch.put(TABLE_META, HIGH_WATER_KEY, str(plan.revision_high_water).encode())
        return batch

    @contextlib.asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[None]:
        async with self._lane:
            try:
                yield
            finally:
                self._drain_node_events()

    # -- node events (NodeManager listener) ----------------------------------------------
    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
        self._node_event(_NodeEvent(node, dead=False))

    def on_nodes_loaded(
        self, nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo], prepared: Prepared
    ) -> None:
        if self._loaded:  # else load() replays from the node table, which has them already
            for node in nodes.values():
                self.on_node_added(node)

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        self._node_event(_NodeEvent(node, dead=True))

    def _node_event(self, event: _NodeEvent) -> None:
        if not self._loaded:
            return  # load() replays from the node table, which has this node already
        if self._lane.busy or self._lane.unresolved:
            self._queued.append(event)
        else:
            self._apply_node_event(event)

    def _drain_node_events(self) -> None:
        if self._lane.unresolved:
            return  # an unresolved plan commits first, once the store can tell
        queued, self._queued = self._queued, []
        for event in queued:
            self._apply_node_event(event)

    def _apply_node_event(self, event: _NodeEvent) -> None:
        node_id = event.node.node_id.hex()
        if event.dead:
            plan = self.registry.mark_node_dead(node_id)
        else:
            plan = self.registry.add_node(node_view_from_gcs_node_info(event.node))
        if plan.empty:
            return
        self.registry.commit(plan)
        if event.dead and self.registry.held_outside_primary(node_id):
            self._background.spawn(
                self._run(lambda: self.registry.note_node_death(node_id)),
                f"vc-node-death-{node_id}",
            )

    # -- jobs and placement groups (JobListener, PlacementGroupListener) -----------------
    def check_job(self, job: gcs_pb2.JobTableData) -> None:
        try:
            self.registry.check_job_virtual_cluster(job.virtual_cluster_id)
        except VcError as err:
            raise JobRejected(err.message) from None

    def on_job_finished(self, job: gcs_pb2.JobTableData) -> None:
        cluster_id = job.virtual_cluster_id
        if is_job_cluster_id(cluster_id):
            self._background.spawn(
                self._run(lambda: self.registry.on_job_finished(cluster_id, self.usage())),
                f"job-finished-{cluster_id}",
            )

    def on_placement_group_created(self, pg: gcs_pb2.PlacementGroupTableData) -> None:
        return None

    def on_placement_group_removed(
        self, pg: gcs_pb2.PlacementGroupTableData, cluster_id: str
    ) -> None:
        if pg.is_detached and is_job_cluster_id(cluster_id):
            self._background.spawn(
                self._run(lambda: self.registry.on_workload_gone(cluster_id, self.usage())),
                f"workload-gone-{cluster_id}",
            )

    async def settle(self) -> None:
        """Wait for queued job/PG follow-ups (tests, shutdown)."""
        await self._background.settle()

    async def close(self) -> None:
        await self._background.close()

    # -- periodic passes -----------------------------------------------------------------
    async def replenish_once(self) -> None:
        await self._run(self.registry.replenish)

    async def collect_expired_once(self) -> None:
        await self._run(lambda: self.registry.collect_expired_job_clusters(self.usage()))

    async def run_periodic(self, period_ms: int, step: Callable[[], object], name: str) -> None:
        """A background loop on the injected clock; a store outage only skips a round.  A
        zero period is off (as ant-ray's periodic runner skips one)."""
        if period_ms <= 0:
            await asyncio.get_running_loop().create_future()  # until cancelled
        while True:
            await self._clock.sleep(period_ms / 1000)
            try:
                await step()  # type: ignore[misc]
            except (Unavailable, StoreError) as err:  # the store's: try again next round
                log.warning("virtual_clusters.periodic_skipped", loop=name, error=err.message)

    # -- RPC operations ------------------------------------------------------------------
    async def create_or_update(
        self,
        cluster_id: str,
        divisible: bool,
        replica_sets: dict[str, int],
        revision: int,
        *,
        autoscaler: bool = False,
        must_exist: bool = False,
    ) -> CreateOrUpdateResult:
        """The tenant's request (it declares the cluster's replica sets), or with
        ``autoscaler`` a move by the autoscaler (same lane and revision rule; the declared
        replica sets stay the floor).  ``must_exist``: an update, never a create."""
        return await self._run(
            lambda: self.registry.create_or_update(
                cluster_id,
                divisible,
                replica_sets,
                revision,
                self.usage(),
                autoscaler,
                must_exist=must_exist,
                launchable=self._launchable,
            )
        )

    async def create_job_cluster(
        self, cluster_id: str, job_id: str, replica_sets: dict[str, int]
    ) -> CreateJobClusterResult:
        return await self._run(
            lambda: self.registry.create_job_cluster(cluster_id, job_id, replica_sets)
        )

    async def remove(self, cluster_id: str) -> None:
        await self._run(lambda: self.registry.remove(cluster_id, self.usage()))

    async def remove_nodes(
        self,
        cluster_id: str,
        node_ids: list[str],
        *,
        revision: int = 0,
        autoscaler: bool = False,
    ) -> None:
        """An operator's removal, or with ``autoscaler`` a release (kept at the floor);
        ``revision`` non-zero must be the cluster's current one."""
        await self._run(
            lambda: self.registry.remove_nodes(
                cluster_id,
                node_ids,
                self.usage(),
                revision=revision,
                autoscaler=autoscaler,
            )
        )

    async def update_autoscaling_config(
        self,
        cluster_id: str,
        min_replica_sets: dict[str, int],
        max_replica_sets: dict[str, int],
        max_nodes: int,
    ) -> None:
        await self._run(
            lambda: self.registry.update_autoscaling_config(
                cluster_id, min_replica_sets, max_replica_sets, max_nodes
            )
        )

    # -- reads ---------------------------------------------------------------------------
    def resources_of(self, node_id: str) -> tuple[dict[str, float], dict[str, float]]:
        entry = self._resources.nodes.get(bytes.fromhex(node_id))
        if entry is None:
            return {}, {}
        return dict(entry.data.resources_total), dict(entry.data.resources_available)

    def node_filter(self, cluster_id: str) -> frozenset[bytes] | None:
        """Node ids (bytes) of a cluster for the GetAllNodeInfo / resources filters; None =
        no filter (empty id); an unknown cluster matches no node."""
        hex_ids = self.registry.nodes_in(cluster_id)
        if hex_ids is None:
            return None
        return frozenset(bytes.fromhex(n) for n in hex_ids)

    def schedulable_nodes(self, cluster_id: str) -> frozenset[bytes] | None:
        """Nodes a workload of ``cluster_id`` may be placed on (the GCS scheduling
        predicate, as ant-ray): None = every node for no id, the primary or an unknown
        cluster; otherwise the cluster's members."""
        if not cluster_id or cluster_id == PRIMARY_CLUSTER_ID:
            return None
        cluster = self.registry.get(cluster_id)
        if cluster is None:
            return None
        return frozenset(bytes.fromhex(n) for n in cluster.members)

    # -- autoscaler ----------------------------------------------------------------------
    def autoscaler_section(self) -> bytes:
        """Serialized ``ClusterResourceState.virtual_cluster_states`` (field 8) entries.

        Empty while only the primary exists (a Ray 2.60 autoscaler never sees the field).
        Cached on (registry generation, demand version, PG version).
        """
        # a job's virtual cluster is fixed when it is added: the job count covers a job
        # whose record arrives after its demand
        key = (
            self.registry.generation,
            self._resources.demand_version,
            self._pgs.version,
            len(self._jobs.jobs),
        )
        if key != self._section_key:
            self._section = self._build_section()
            self._section_key = key
        return self._section

    def _build_section(self) -> bytes:
        clusters = {c.id: c for c in self.registry.clusters()}
        if len(clusters) <= 1:
            return b""
        states = self.registry.autoscaler_states()
        gangs: dict[str, list[autoscaler_pb2.GangResourceRequest]] = {}
        for pg in self._pgs.pending():
            cluster_id = self._pgs.virtual_cluster_of.get(pg.placement_group_id, "")
            cluster = clusters.get(cluster_id)
            if cluster is not None and cluster.indivisible:
                gangs.setdefault(cluster_id, []).append(gang_request(pg))
        parts = []
        for cluster_id in sorted(states):
            state = states[cluster_id]
            cluster = clusters[cluster_id]
            if cluster.indivisible:
                _add_pending(state, self._demand_of(cluster))
                state.pending_gang_resource_requests.extend(gangs.get(cluster_id, ()))
            entry = string_field(1, cluster_id) + len_field(
                2, state.SerializeToString(deterministic=True)
            )
            parts.append(len_field(8, entry))
        return b"".join(parts)

    def _demand_of(self, cluster: Cluster) -> dict:  # type: ignore[type-arg]
        """The cluster's pending task demand: what the jobs running in it queued, wherever
        it waits.  Demand is booked to a virtual cluster only when its job says so (the
        job's ``virtual_cluster_id``); a request queued on a member node by a job outside
        the cluster (an infeasible task waits on the raylet it was sent to) is not the
        cluster's, and a Ray raylet, which does not name the job of a load row, books none.
        """
        total: dict = {}  # type: ignore[type-arg]
        for job_id, rows in self._resources.job_demand.items():
            if self._jobs.virtual_cluster_of(job_id) != cluster.id:
                continue
            for key, count in rows.items():
                total[key] = total.get(key, 0) + count
        return total


def _add_pending(state: autoscaler_pb2.VirtualClusterState, demand: dict) -> None:  # type: ignore[type-arg]
    for (shape, selectors), count in sorted(demand.items()):
        if count <= 0:
            continue
        by_count = state.pending_resource_requests.add(count=count)
        by_count.request.resources_bundle.update(dict(shape))
        for raw in selectors:
            by_count.request.label_selectors.add().ParseFromString(raw)


__all__ = ["LiveUsage", "VirtualClusterManager"]
