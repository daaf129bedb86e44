"""Places pending placement groups on raylets: policy, then Ray's two-phase reservation.

One pass (:meth:`PlacementGroupScheduler.place_once`):

1. take up to ``max_groups_per_pass`` PENDING / RESCHEDULING groups that are not being
   placed and whose retry time has come (RESCHEDULING first, then oldest first);
2. ask the pure policy (:mod:`gcs.policy.placement.policy`) for bundle -> node, against the alive,
   non-draining nodes' reported availability (minus what this scheduler reserved since the
   node last reported), restricted to the group's virtual cluster;
3. per placed group, in the background: the two-phase reservation on the chosen raylets
   (:mod:`gcs.managers.bundle_reservations`), then the manager records the nodes (CREATED
   when every bundle is placed); a failed reservation leaves nothing reserved and the group
   pending (and gang demand) until a later pass.

Passes are driven by events (node added, group created / removed, bundles lost, a
two-phase commit finished while groups wait for its slot) and by a periodic retry
(resources freed by leases are seen only through load reports); a group that could not be
placed waits ``retry_interval_s`` on the injected clock before it is tried again, unless an
event makes it worth trying sooner.

Other duties, from the events it listens to: a dead node's bundles are marked lost (only
those are placed again); a removed group's bundles are returned to their raylets; a
finished job's non-detached groups are removed.  After a GCS restart
:meth:`release_unused` tells every alive raylet which bundles are still in use
(``ReleaseUnusedBundles``) before the first pass.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from gcs.base.background import Background
from gcs.base.changes import Changes
from gcs.base.clock import Clock, wait_event
from gcs.base.errors import GcsError, Unavailable
from gcs.managers.bundle_reservations import BundleReservations, group_by_node
from gcs.managers.events import Prepared
from gcs.managers.nodes import NodeManager
from gcs.managers.placement_groups import PG, PlacementGroupManager, is_placed
from gcs.managers.resources import ResourceCache
from gcs.policy.placement.naming import is_group_resource
from gcs.policy.placement.policy import (
    BundleDemand,
    GroupRequest,
    NodeView,
    Outcome,
    Placement,
    place_groups,
    selector_from_map,
)
from gcs.proto import common_pb2, gcs_pb2
from gcs.rpc.raylet_io.gateway import RayletGateway
from gcs.store.errors import StoreOutcomeUnknown

log = structlog.get_logger("gcs.placement_groups")

_STATS_OF = {
    Outcome.PLACED: gcs_pb2.PlacementGroupStats.SCHEDULING_STARTED,
    Outcome.NO_RESOURCES: gcs_pb2.PlacementGroupStats.NO_RESOURCES,
    Outcome.INFEASIBLE: gcs_pb2.PlacementGroupStats.INFEASIBLE,
}
"""A pass's answer as Ray's ``PlacementGroupStats.scheduling_state``."""

ClusterNodes = Callable[[str], frozenset[bytes] | None]
"""virtual cluster id -> its node ids (None: no restriction)."""


def _any_node(cluster_id: str) -> frozenset[bytes] | None:
    return None


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    rpc_timeout_s: float = 10.0
    """Deadline of each prepare / commit / return call."""
    retry_interval_s: float = 1.0
    """A group that could not be placed is retried after this long (periodic pass too)."""
    max_groups_per_pass: int = 100
    """Bounded work per pass; the rest wait for the next one."""
    max_in_flight: int = 32
    """Groups in two-phase commit at once."""


class PlacementGroupScheduler:
    def __init__(
        self,
        pgs: PlacementGroupManager,
        nodes: NodeManager,
        cache: ResourceCache,
        raylets: RayletGateway,
        clock: Clock,
        *,
        cluster_nodes: ClusterNodes = _any_node,
        config: PlacementConfig | None = None,
    ) -> None:
        self._pgs = pgs
        self._nodes = nodes
        self._cache = cache
        self._clock = clock
        self._cluster_nodes = cluster_nodes
        self.config = config or PlacementConfig()
        self._reservations = BundleReservations(raylets, nodes, self.config.rpc_timeout_s)
        self._wake = asyncio.Event()
        self._in_flight: dict[bytes, asyncio.Task[None]] = {}
        self._not_before: dict[bytes, float] = {}
        self._reserved: dict[bytes, list[tuple[bytes, dict[str, float], int]]] = {}
        """Node -> (group, resources its bundles take there, the node's report generation
        then): what the cached report cannot show yet."""
        self._background = Background("pg_scheduler")
        self._views: dict[bytes, tuple[gcs_pb2.GcsNodeInfo, int, NodeView]] = {}
        """Node -> (the node info and report generation the view was built from, view)."""
        self.views_built = 0
        """Node views (re)built for the policy (tests count the work done)."""
        self.passes = 0
        """Passes the loop (:meth:`run`) has made."""
        self.changes = Changes()
        """Notified after every pass of the loop and every finished two-phase commit."""
        self._left_over = False
        """The last pass left due groups for want of room (in flight / per pass)."""
        self._last_outcome: dict[bytes, Placement] = {}
        """Group id -> the policy's latest answer (reasons for pending groups)."""

    # -- events (called synchronously from the emitters' apply steps) --------------------------

    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
        self.kick(retry_all=True)

    def on_nodes_loaded(
        self, nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo], prepared: Prepared
    ) -> None:
        if nodes:
            self.kick(retry_all=True)

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        self._reserved.pop(node.node_id, None)
        self._background.spawn(self._lose_bundles(node.node_id), "bundles-lost")

    def check_job(self, job: gcs_pb2.JobTableData) -> None:
        return None

    def on_job_finished(self, job: gcs_pb2.JobTableData) -> None:
        self._background.spawn(self._pgs.job_finished(job.job_id), "job-finished")

    def on_placement_group_created(self, pg: gcs_pb2.PlacementGroupTableData) -> None:
        self.kick()

    def on_placement_group_removed(
        self, pg: gcs_pb2.PlacementGroupTableData, virtual_cluster_id: str
    ) -> None:
        # Its reservations end here: a raylet that committed and returned the bundles
        # between two of its reports sends a view equal to the last one, so no new report
        # would ever retire them (the freed room stayed invisible to later groups).
        self._unreserve(pg.placement_group_id)
        placed = group_by_node([b for b in pg.bundles if is_placed(b)])
        if placed:
            give_back = self._reservations.give_back(pg.placement_group_id, placed)
            self._background.spawn(give_back, "return-bundles")
        self.kick(retry_all=True)  # resources are freed

    def kick(self, *, retry_all: bool = False) -> None:
        """Run a pass soon; ``retry_all`` also ends every group's retry wait."""
        if retry_all:
            self._not_before.clear()
        self._wake.set()

    # -- loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Repair and release unused bundles (restart), then pass on every kick or retry
        interval."""
        await self.repair()
        await self.release_unused()
        while True:
            self._wake.clear()
            await self.place_once()
            self.passes += 1
            self.changes.notify()
            await wait_event(self._clock, self._wake, self.config.retry_interval_s)

    async def close(self) -> None:
        await self._background.close()

    async def settle(self) -> None:
        """Wait for background work (two-phase commits, returns, event follow-ups)."""
        await self._background.settle()

    async def repair(self) -> None:
        """Bundles recorded on nodes that are not alive (the GCS stopped between a node's
        death and its bundles being marked lost) are lost now; groups of jobs that finished
        likewise follow their lifetime rule now."""
        await self._pgs.finish_dead_jobs()
        for node_id in list(self._pgs.bundles_in_use()):
            if not self._nodes.is_alive(node_id):
                await self._pgs.bundles_lost(node_id)

    async def release_unused(self) -> None:
        """``ReleaseUnusedBundles`` to every alive raylet with the bundles in use there."""
        await self._reservations.release_unused(self._pgs.bundles_in_use())

    # -- one pass ------------------------------------------------------------------------------

    async def place_once(self) -> list[Placement]:
        """Decide for the due groups and start their two-phase commits; returns the
        policy's answers (tests read them)."""
        now = self._clock.monotonic_s()
        due = [
            pg
            for pg in self._pgs.pending()
            if pg.placement_group_id not in self._in_flight
            and self._not_before.get(pg.placement_group_id, 0.0) <= now
        ]
        due.sort(
            key=lambda pg: (pg.state != PG.RESCHEDULING, pg.placement_group_creation_timestamp_ms)
        )
        room = self.config.max_in_flight - len(self._in_flight)
        take = max(0, min(self.config.max_groups_per_pass, room))
        self._left_over = len(due) > take
        due = due[:take]
        if not due:
            return []
        results = place_groups([self._request(pg) for pg in due], self._node_views())
        for pg, result in zip(due, results, strict=True):
            pg_id = pg.placement_group_id
            self._last_outcome[pg_id] = result
            self._pgs.note_attempt(pg_id, _STATS_OF[result.outcome])
            if result.outcome is Outcome.PLACED:
                self._reserve(pg, result.assignment)
                task = self._background.spawn(
                    self._two_phase(pg, dict(result.assignment)), "two-phase"
                )
                if task is not None:
                    self._in_flight[pg_id] = task
                    task.add_done_callback(functools.partial(self._two_phase_done, pg_id))
            else:
                self._not_before[pg_id] = now + self.config.retry_interval_s
                log.debug("pg.not_placed", pg_id=pg_id.hex(), outcome=result.outcome.value)
        return results

    def _two_phase_done(self, pg_id: bytes, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(pg_id, None)
        self.changes.notify()
        if task.cancelled():
            return
        if self._left_over:  # groups a full pass left over are placed now, not on the timer
            self._wake.set()
        err = task.exception()  # logged by the Background; the group is tried again later
        if err is not None:
            self._retry_later(pg_id, f"placement failed: {err!r}")

    def _request(self, pg: gcs_pb2.PlacementGroupTableData) -> GroupRequest:
        cluster = self._pgs.virtual_cluster_of.get(pg.placement_group_id, "")
        return GroupRequest(
            group_id=pg.placement_group_id,
            strategy=pg.strategy,
            bundles=tuple(
                BundleDemand(
                    index=i,
                    resources=dict(b.unit_resources),
                    selector=selector_from_map(b.label_selector),
                    node_id=b.node_id if is_placed(b) else b"",
                )
                for i, b in enumerate(pg.bundles)
            ),
            soft_target_node_id=pg.soft_target_node_id,
            allowed=self._cluster_nodes(cluster) if cluster else None,
        )

    def _node_views(self) -> list[NodeView]:
        """Alive, non-draining nodes as the policy sees them; a node's view is rebuilt only
        when its report (or registration) changed, or this scheduler reserved on it."""
        views = []
        for node_id, node in self._nodes.alive.items():
            entry = self._cache.nodes.get(node_id)
            if entry is not None and entry.is_draining:
                continue
            generation = entry.generation if entry is not None else -1
            cached = self._views.get(node_id)
            if cached is None or cached[0] is not node or cached[1] != generation:
                # a bundle never asks for another group's resources: the names committed
                # bundles expose (4 per bundle) stay out, or every view built and every class
                # key sorted would grow with the groups placed on the node
                if entry is not None:
                    available_map, total_map = entry.resource_maps()
                    total = _own(total_map)
                    available = {n: available_map[n] for n in total if n in available_map}
                else:
                    total = _own(node.resources_total)
                    available = dict(total)
                self.views_built += 1
                cached = (node, generation, NodeView(node_id, available, total, dict(node.labels)))
                self._views[node_id] = cached
            view = cached[2]
            if node_id in self._reserved:
                reserved = self._fresh_reservations(node_id)
                if reserved:
                    available = dict(view.available)
                    for _, shape, _ in reserved:
                        for name, amount in shape.items():
                            available[name] = available.get(name, 0.0) - amount
                    view = NodeView(node_id, available, view.total, view.labels)
            views.append(view)
        if len(self._views) > len(self._nodes.alive) + 64:
            self._views = {k: v for k, v in self._views.items() if k in self._nodes.alive}
        return views

    def _reserve(
        self, pg: gcs_pb2.PlacementGroupTableData, assignment: Mapping[int, bytes]
    ) -> None:
        for index, node_id in assignment.items():
            entry = self._cache.nodes.get(node_id)
            generation = entry.generation if entry is not None else 0
            shape = dict(pg.bundles[index].unit_resources)
            self._reserved.setdefault(node_id, []).append(
                (pg.placement_group_id, shape, generation)
            )

    def _unreserve(self, pg_id: bytes) -> None:
        for node_id in list(self._reserved):
            kept = [r for r in self._reserved[node_id] if r[0] != pg_id]
            if kept:
                self._reserved[node_id] = kept
            else:
                del self._reserved[node_id]

    def _fresh_reservations(self, node_id: bytes) -> list[tuple[bytes, dict[str, float], int]]:
        """Reservations the node's cached report cannot show yet (made before its report
        changed)."""
        entry = self._cache.nodes.get(node_id)
        kept = [
            r
            for r in self._reserved.get(node_id, [])
            if entry is not None and r[2] >= entry.generation
        ]
        if kept:
            self._reserved[node_id] = kept
        else:
            self._reserved.pop(node_id, None)
        return kept

    # -- two-phase commit ----------------------------------------------------------------------

    async def _two_phase(
        self, pg: gcs_pb2.PlacementGroupTableData, assignment: dict[int, bytes]
    ) -> None:
        pg_id = pg.placement_group_id
        chosen = []
        for index, node_id in sorted(assignment.items()):
            bundle = common_pb2.Bundle()
            bundle.CopyFrom(pg.bundles[index])
            bundle.node_id = node_id
            chosen.append(bundle)
        by_node = group_by_node(chosen)
        why = await self._reservations.reserve(pg_id, by_node)
        if why:
            self._retry_later(pg_id, why)
            return
        try:
            recorded = await self._pgs.record_placement(pg_id, assignment, self._nodes.is_alive)
        except StoreOutcomeUnknown as err:
            log.warning("pg.record_unresolved", pg_id=pg_id.hex(), error=err.message)
            recorded = await self._recorded_once_resolved(pg_id, assignment)
        except GcsError as err:  # not persisted (store down): the raylets must not keep them
            log.warning("pg.record_failed", pg_id=pg_id.hex(), error=err.message)
            recorded = False
        if not recorded:  # removed meanwhile, a node died, or not persisted: give them back
            await self._reservations.give_back(pg_id, by_node)
            self._retry_later(pg_id, "the placement was not recorded")
            return
        self._last_outcome.pop(pg_id, None)
        log.info("pg.placed", pg_id=pg_id.hex(), nodes=len(by_node))

    async def _recorded_once_resolved(self, pg_id: bytes, assignment: Mapping[int, bytes]) -> bool:
        """The record may have landed.  The manager's lane resolves it before its next
        write; wait until it can (the group keeps its in-flight slot meanwhile, so it is not
        placed twice), then read whether the group holds this placement."""
        while True:
            try:
                await self._pgs.resolve_writes()
            except Unavailable as err:  # the store still cannot tell
                log.info("pg.record_still_unresolved", pg_id=pg_id.hex(), error=err.message)
                await self._clock.sleep(self.config.retry_interval_s)
                continue
            return self._pgs.holds_placement(pg_id, assignment)

    def _retry_later(self, pg_id: bytes, why: str) -> None:
        self._unreserve(pg_id)
        self._not_before[pg_id] = self._clock.monotonic_s() + self.config.retry_interval_s
        log.info("pg.retry_later", pg_id=pg_id.hex(), reason=why)

    async def _lose_bundles(self, node_id: bytes) -> None:
        if await self._pgs.bundles_lost(node_id):
            self.kick(retry_all=True)


def _own(resources: Mapping[str, float]) -> dict[str, float]:
    """A node's own resources, without the names its committed bundles expose."""
    return {name: resources[name] for name in resources if not is_group_resource(name)}
