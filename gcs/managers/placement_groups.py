"""Placement groups: records, placement results, waiters, and their pending load.

The state half of Ray's ``GcsPlacementGroupManager``: PGs are created PENDING, persisted,
listed, removed; pending / rescheduling ones become ``GangResourceRequest``s in
``GetClusterResourceState``, as in Ray.  Where bundles go and the two-phase
reservation on raylets is :class:`~gcs.managers.pg_scheduler.PlacementGroupScheduler`'s job;
it reports here (:meth:`PlacementGroupManager.record_placement`, :meth:`~PlacementGroupManager.
bundles_lost`), and every change runs on this manager's :class:`~gcs.managers.lane.ApplyLane`
(validate -> persist -> apply -> publish).  The bundles' node ids are persisted with the
group (``PlacementGroupTableData.bundles[].node_id``), so a restarted GCS knows which
bundles are in use where.  A group is persisted only PENDING / RESCHEDULING (placed bundles
keep their node) / CREATED / REMOVED: Ray's PREPARED phase is not persisted (a restart
releases prepared-only bundles through ``ReleaseUnusedBundles`` and places them again).

Virtual clusters: our ``PlacementGroupTableData`` has no ``virtual_cluster_id`` (ant-ray's
field 17 collides with Ray 2.60's ``topology_assignments``, and its ``PlacementGroupSpec``
field 12 with ``topology_strategy``), so a PG's virtual cluster id is resolved at creation by
``job_cluster`` (the creator job's cluster, given at construction) and kept in a sidecar
persisted in the same batch under ``GCS_META`` ``pg_vc:<pg id>``.

Removals are told to :class:`~gcs.managers.events.PlacementGroupEvents` listeners after
they are persisted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import structlog

from gcs.base.clock import Clock, now_ms
from gcs.base.errors import FailedPrecondition, InvalidArgument, NotFound
from gcs.base.labels import selector_proto as parse_selector
from gcs.managers.events import PlacementGroupEvents
from gcs.managers.lane import ApplyLane, ResolvePolicy
from gcs.proto import autoscaler_pb2, common_pb2, gcs_pb2
from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_META, TABLE_PLACEMENT_GROUP

log = structlog.get_logger("gcs.placement_groups")

PG = gcs_pb2.PlacementGroupTableData
STATS = gcs_pb2.PlacementGroupStats
PENDING_STATES = (PG.PENDING, PG.RESCHEDULING)


@dataclass(slots=True)
class _Attempts:
    started_ns: int
    """When the first attempt started (Ray's ``scheduling_started_time_ns``)."""
    count: int = 0
    state: int = STATS.QUEUED


MAX_LOAD_REPORT = 1000  # Ray: max_placement_group_load_report_size
VC_SIDECAR_PREFIX = b"pg_vc:"
NIL_NODE = b"\xff" * 28
REMOVED_BEFORE_CREATED = "Placement group is removed before it is created."
REMOVED = "Placement group is removed."
JobCluster = Callable[[bytes], str]
"""creator job id -> its virtual cluster id ("" = none / the primary)."""
JobNamespace = Callable[[bytes], str]
"""creator job id -> its Ray namespace ("" when unknown)."""


def _no_cluster(job_id: bytes) -> str:
    return ""


def is_placed(bundle: common_pb2.Bundle) -> bool:
    return bool(bundle.node_id) and bundle.node_id != NIL_NODE


def _copy(pg: gcs_pb2.PlacementGroupTableData) -> gcs_pb2.PlacementGroupTableData:
    out = PG()
    out.CopyFrom(pg)
    return out


class PlacementGroupManager:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        events: PlacementGroupEvents | None = None,
        job_cluster: JobCluster = _no_cluster,
        job_namespace: JobNamespace = _no_cluster,
        job_is_dead: Callable[[bytes], bool] = lambda job_id: False,
        lane_policy: ResolvePolicy | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._events = events if events is not None else PlacementGroupEvents()
        self._job_cluster = job_cluster
        self._job_namespace = job_namespace
        self._job_is_dead = job_is_dead
        self._lane = ApplyLane(store, "placement_groups", clock, policy=lane_policy)
        self._groups: dict[bytes, gcs_pb2.PlacementGroupTableData] = {}
        self.groups: Mapping[bytes, gcs_pb2.PlacementGroupTableData] = MappingProxyType(
            self._groups
        )
        """Every group by id (removed ones too): a read-only live view."""
        self._virtual_cluster_of: dict[bytes, str] = {}
        self.virtual_cluster_of: Mapping[bytes, str] = MappingProxyType(self._virtual_cluster_of)
        """PG id -> virtual cluster id (only PGs created inside one): a read-only view."""
        self._named: dict[tuple[str, str], bytes] = {}
        self.named: Mapping[tuple[str, str], bytes] = MappingProxyType(self._named)
        """(namespace, name) -> id of the live (not removed) group of that name."""
        self._waiters: dict[bytes, list[asyncio.Future[None]]] = {}
        self._attempts: dict[bytes, _Attempts] = {}
        """Scheduling attempts of pending groups (Ray's live ``PlacementGroupStats``): kept
        in memory, shown by the reads, persisted with the group once it is CREATED."""
        self.version = 0
        """Bumped on every change (caches of pending gangs and PG labels key on it)."""
        self._pending: dict[bytes, int] = {}
        """PENDING / RESCHEDULING group id -> its place in ``_groups`` (creation order): the
        scheduler, the load report and the autoscaler read the pending groups on every pass,
        which must not cost a scan of every group ever created (removed ones stay)."""
        self._rank: dict[bytes, int] = {}

    async def load(self) -> None:
        for raw in (await self._store.get_all(TABLE_PLACEMENT_GROUP)).values():
            pg = PG.FromString(raw)
            self._put(pg)
            if pg.name and pg.state != PG.REMOVED:
                self._named[(pg.ray_namespace, pg.name)] = pg.placement_group_id
        sidecar = await self._store.scan_prefix(TABLE_META, VC_SIDECAR_PREFIX)
        for key, value in sidecar.items():
            pg_id = key[len(VC_SIDECAR_PREFIX) :]
            if pg_id in self._groups:
                self._virtual_cluster_of[pg_id] = value.decode()
        self.version += 1

    # -- commands ----------------------------------------------------------------------------

    async def create(self, spec: common_pb2.PlacementGroupSpec) -> None:
        """Register a PENDING group; idempotent per id.  A name taken in the creator job's
        namespace is refused (``FailedPrecondition``, Ray's ``Invalid``)."""
        pg_id = spec.placement_group_id
        if len(pg_id) != 18:
            raise InvalidArgument(
                f"placement_group_spec.placement_group_id must be 18 bytes, got {len(pg_id)}"
            )
        if not spec.bundles:
            raise InvalidArgument("placement_group_spec.bundles must not be empty")
        for i, bundle in enumerate(spec.bundles):
            if not bundle.unit_resources:
                raise InvalidArgument(f"placement_group_spec.bundles[{i}].unit_resources is empty")
            for name, amount in bundle.unit_resources.items():
                if not amount >= 0:
                    raise InvalidArgument(
                        f"placement_group_spec.bundles[{i}].unit_resources[{name}] must be >= 0"
                    )
        if spec.strategy not in common_pb2.PlacementStrategy.values():
            raise InvalidArgument(f"placement_group_spec.strategy: unknown value {spec.strategy}")
        namespace = self._job_namespace(spec.creator_job_id)
        async with self._lane:
            if pg_id in self._groups:
                return  # idempotent retry
            if spec.name and (namespace, spec.name) in self._named:
                raise FailedPrecondition(
                    f"Failed to create placement group '{pg_id.hex()}' because name "
                    f"'{spec.name}' already exists."
                )
            pg = PG(
                placement_group_id=pg_id,
                name=spec.name,
                bundles=spec.bundles,
                strategy=spec.strategy,
                state=PG.PENDING,
                creator_job_id=spec.creator_job_id,
                creator_actor_id=spec.creator_actor_id,
                # as the core worker sets them: a driver / task creator has no actor (dead),
                # a detached actor's group counts its job as dead (it outlives the job)
                creator_actor_dead=spec.creator_actor_dead
                or not any(spec.creator_actor_id.strip(b"\xff")),
                creator_job_dead=spec.creator_job_dead,
                is_detached=spec.is_detached,
                ray_namespace=namespace,
                soft_target_node_id=spec.soft_target_node_id,
                placement_group_creation_timestamp_ms=now_ms(self._clock),
                stats=gcs_pb2.PlacementGroupStats(
                    creation_request_received_ns=int(self._clock.now_s() * 1e9),
                    scheduling_state=STATS.QUEUED,
                ),
            )
            for i, bundle in enumerate(pg.bundles):
                bundle.bundle_id.placement_group_id = pg_id
                bundle.bundle_id.bundle_index = i
                bundle.ClearField("node_id")
            vc_id = self._job_cluster(spec.creator_job_id)
            batch = WriteBatch().put(TABLE_PLACEMENT_GROUP, pg_id, pg.SerializeToString())
            if vc_id:
                batch.put(TABLE_META, VC_SIDECAR_PREFIX + pg_id, vc_id.encode())

            def apply() -> None:
                self._put(pg)
                if pg.name:
                    self._named[(namespace, pg.name)] = pg_id
                if vc_id:
                    self._virtual_cluster_of[pg_id] = vc_id
                self.version += 1
                for listener in self._events:
                    listener.on_placement_group_created(pg)

            await self._lane.commit(batch, apply)

    async def remove(self, pg_id: bytes) -> None:
        """Idempotent, as Ray's GCS: an unknown id is a no-op answered OK (it may be a group
        removed long ago; ``ray.util.remove_placement_group`` must not raise for it)."""
        async with self._lane:
            pg = self._groups.get(pg_id)
            if pg is None:
                log.info("pg.remove_unknown", pg_id=pg_id.hex())
                return
            if pg.state == PG.REMOVED:
                return
            await self._remove_locked([pg])

    async def job_finished(self, job_id: bytes) -> list[bytes]:
        """Ray's lifetime rule: every live group of the job is marked ``creator_job_dead``;
        a non-detached one whose creator actor is dead too (a driver-created group has no
        actor) is removed.  Returns the removed ids."""
        return await self._creator_dead(lambda pg: pg.creator_job_id == job_id, "creator_job_dead")

    async def creator_actor_dead(self, actor_id: bytes) -> list[bytes]:
        """The other half of the rule (Ray's ``CleanPlacementGroupIfNeededWhenActorDead``,
        called when an actor dies *or restarts*): the actor's groups are marked
        ``creator_actor_dead``; a non-detached one whose creator job is dead too is removed,
        so its bundles return to the raylets.  Returns the removed ids."""
        return await self._creator_dead(
            lambda pg: pg.creator_actor_id == actor_id, "creator_actor_dead"
        )

    async def _creator_dead(
        self, created_by: Callable[[gcs_pb2.PlacementGroupTableData], bool], mark: str
    ) -> list[bytes]:
        async with self._lane:
            changed = []
            for pg in self._groups.values():
                if not created_by(pg) or pg.state == PG.REMOVED:
                    continue
                new = _copy(pg)
                setattr(new, mark, True)
                if not new.is_detached and new.creator_actor_dead and new.creator_job_dead:
                    new.state = PG.REMOVED
                    new.stats.scheduling_state = STATS.REMOVED
                if new != pg:
                    changed.append(new)
            if changed:
                await self._commit_changes(changed)
            return [pg.placement_group_id for pg in changed if pg.state == PG.REMOVED]

    async def finish_dead_jobs(self) -> list[bytes]:
        """At start-up (job table loaded): :meth:`job_finished` for the creator jobs that
        finished while their groups did not hear of it (the GCS was killed in between), as
        Ray's ``GcsPlacementGroupManager::Initialize`` does.  Returns the removed ids."""
        finished = {
            pg.creator_job_id
            for pg in self._groups.values()
            if pg.state != PG.REMOVED
            and not pg.creator_job_dead
            and self._job_is_dead(pg.creator_job_id)
        }
        removed: list[bytes] = []
        for job_id in sorted(finished):
            removed += await self.job_finished(job_id)
        return removed

    async def _remove_locked(self, groups: list[gcs_pb2.PlacementGroupTableData]) -> None:
        removed = []
        for pg in groups:
            new = _copy(pg)
            new.state = PG.REMOVED
            new.stats.scheduling_state = STATS.REMOVED
            removed.append(new)
        await self._commit_changes(removed)

    async def _commit_changes(self, changed: list[gcs_pb2.PlacementGroupTableData]) -> None:
        """Persist changed groups in one batch; removals free their name, fail their
        waiters and are told to listeners."""
        batch = WriteBatch()
        for new in changed:
            batch.put(TABLE_PLACEMENT_GROUP, new.placement_group_id, new.SerializeToString())

        def apply() -> None:
            for new in changed:
                pg_id = new.placement_group_id
                self._put(new)
                if new.state != PG.REMOVED:
                    continue
                self._attempts.pop(pg_id, None)
                if self._named.get((new.ray_namespace, new.name)) == pg_id:
                    del self._named[(new.ray_namespace, new.name)]
                self._wake(pg_id, NotFound(REMOVED_BEFORE_CREATED))
                cluster = self._virtual_cluster_of.get(pg_id, "")
                for listener in self._events:
                    listener.on_placement_group_removed(new, cluster)
            self.version += 1

        await self._lane.commit(batch, apply)

    async def record_placement(
        self, pg_id: bytes, assignment: Mapping[int, bytes], is_alive: Callable[[bytes], bool]
    ) -> bool:
        """Bundles committed on raylets: persist their nodes; CREATED once all are placed.

        False (nothing recorded) when the group was removed meanwhile, a bundle is placed
        already, or a chosen node died: the caller returns the bundles to the raylets.
        """
        async with self._lane:
            pg = self._groups.get(pg_id)
            if pg is None or pg.state not in PENDING_STATES:
                return False
            for index, node_id in assignment.items():
                if not 0 <= index < len(pg.bundles) or is_placed(pg.bundles[index]):
                    return False
                if not is_alive(node_id):
                    return False
            new = _copy(pg)
            for index, node_id in assignment.items():
                new.bundles[index].node_id = node_id
            if all(is_placed(b) for b in new.bundles):
                new.state = PG.CREATED
                self._fold_attempts(new)
                new.stats.scheduling_state = STATS.FINISHED
                received_ns = new.stats.creation_request_received_ns
                if received_ns:
                    latency_us = (int(self._clock.now_s() * 1e9) - received_ns) // 1000
                    new.stats.end_to_end_creation_latency_us = max(0, latency_us)
                new.placement_group_final_bundle_placement_timestamp_ms = now_ms(self._clock)

            def apply() -> None:
                self._put(new)
                self.version += 1
                if new.state == PG.CREATED:
                    self._attempts.pop(pg_id, None)
                    self._wake(pg_id, None)

            batch = WriteBatch().put(TABLE_PLACEMENT_GROUP, pg_id, new.SerializeToString())
            await self._lane.commit(batch, apply)
            return True

    async def resolve_writes(self) -> None:
        """Resolve an ambiguous write of this manager now (see :meth:`ApplyLane.resolve`)."""
        await self._lane.resolve()

    def holds_placement(self, pg_id: bytes, assignment: Mapping[int, bytes]) -> bool:
        """Whether the group records each bundle of ``assignment`` on its node."""
        pg = self._groups.get(pg_id)
        return pg is not None and all(
            0 <= index < len(pg.bundles) and pg.bundles[index].node_id == node_id
            for index, node_id in assignment.items()
        )

    async def bundles_lost(self, node_id: bytes) -> list[bytes]:
        """A node died: only its bundles become unplaced; CREATED groups -> RESCHEDULING.
        Returns the ids of the groups that lost bundles."""
        async with self._lane:
            changed = []
            batch = WriteBatch()
            for pg in self._groups.values():
                if pg.state == PG.REMOVED or not any(b.node_id == node_id for b in pg.bundles):
                    continue
                new = _copy(pg)
                for bundle in new.bundles:
                    if bundle.node_id == node_id:
                        bundle.ClearField("node_id")
                if new.state == PG.CREATED:
                    new.state = PG.RESCHEDULING
                    new.stats.scheduling_state = STATS.QUEUED
                batch.put(TABLE_PLACEMENT_GROUP, new.placement_group_id, new.SerializeToString())
                changed.append(new)
            if not changed:
                return []

            def apply() -> None:
                for new in changed:
                    self._put(new)
                self.version += 1

            await self._lane.commit(batch, apply)
            return [pg.placement_group_id for pg in changed]

    # -- waiting -----------------------------------------------------------------------------

    async def wait_ready(self, pg_id: bytes) -> None:
        """Return once the group is CREATED; ``NotFound`` once it is removed.  An unknown id
        waits for its creation (Ray: create and wait may arrive in either order)."""
        pg = self._groups.get(pg_id)
        if pg is not None and pg.state == PG.CREATED:
            return
        if pg is not None and pg.state == PG.REMOVED:
            raise NotFound(REMOVED)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(pg_id, []).append(fut)
        try:
            await fut
        finally:
            waiters = self._waiters.get(pg_id)
            if waiters is not None and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._waiters[pg_id]

    def _wake(self, pg_id: bytes, error: Exception | None) -> None:
        for fut in self._waiters.pop(pg_id, []):
            if fut.done():
                continue
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    # -- scheduling stats (memory only) --------------------------------------------------------

    def note_attempt(self, pg_id: bytes, outcome: int) -> None:
        """The scheduler tried to place a pending group: one more attempt, and its outcome
        (``SCHEDULING_STARTED`` when placed and being committed, ``NO_RESOURCES`` or
        ``INFEASIBLE``), as Ray's ``placement_group_table()`` shows them."""
        pg = self.groups.get(pg_id)
        if pg is None or pg.state not in PENDING_STATES:
            return
        attempts = self._attempts.get(pg_id)
        if attempts is None:
            attempts = self._attempts[pg_id] = _Attempts(int(self._clock.now_s() * 1e9))
        attempts.count += 1
        attempts.state = outcome

    def _fold_attempts(self, pg: gcs_pb2.PlacementGroupTableData) -> None:
        attempts = self._attempts.get(pg.placement_group_id)
        if attempts is None:
            return
        stats = pg.stats
        stats.scheduling_attempt += attempts.count
        stats.scheduling_state = attempts.state  # type: ignore[assignment]
        stats.scheduling_started_time_ns = attempts.started_ns
        stats.scheduling_latency_us = max(
            0, (int(self._clock.now_s() * 1e9) - attempts.started_ns) // 1000
        )

    def with_live_stats(
        self, pg: gcs_pb2.PlacementGroupTableData
    ) -> gcs_pb2.PlacementGroupTableData:
        """``pg`` as a read shows it: a pending group with its scheduling attempts so far."""
        if pg.placement_group_id not in self._attempts:
            return pg
        shown = _copy(pg)
        self._fold_attempts(shown)
        shown.stats.ClearField("scheduling_latency_us")
        return shown

    # -- reads -------------------------------------------------------------------------------

    def get(self, pg_id: bytes) -> gcs_pb2.PlacementGroupTableData | None:
        pg = self._groups.get(pg_id)
        return self.with_live_stats(pg) if pg is not None else None

    def get_named(self, name: str, namespace: str) -> gcs_pb2.PlacementGroupTableData | None:
        pg_id = self._named.get((namespace, name))
        return self.get(pg_id) if pg_id is not None else None

    def count_by_state(self) -> dict[str, float]:
        """Groups by state name (metrics)."""
        counts: dict[str, float] = {}
        for pg in self._groups.values():
            name = PG.PlacementGroupState.Name(pg.state)
            counts[name] = counts.get(name, 0) + 1
        return counts

    def _put(self, pg: gcs_pb2.PlacementGroupTableData) -> None:
        """Store ``pg`` (new, or a group's next version) and keep the pending index."""
        pg_id = pg.placement_group_id
        self._groups[pg_id] = pg
        rank = self._rank.setdefault(pg_id, len(self._rank))
        if pg.state in PENDING_STATES:
            self._pending[pg_id] = rank
        else:
            self._pending.pop(pg_id, None)

    def pending(self) -> Iterator[gcs_pb2.PlacementGroupTableData]:
        """The pending groups in creation order, at most ``MAX_LOAD_REPORT``."""
        pending = self._pending
        ids = sorted(pending, key=pending.__getitem__) if len(pending) > 1 else list(pending)
        groups = self._groups
        return iter([groups[pg_id] for pg_id in ids[:MAX_LOAD_REPORT]])

    def bundles_in_use(self) -> dict[bytes, list[common_pb2.Bundle]]:
        """Node id -> the placed bundles of live groups there (for ReleaseUnusedBundles)."""
        out: dict[bytes, list[common_pb2.Bundle]] = {}
        for pg in self._groups.values():
            if pg.state == PG.REMOVED:
                continue
            for bundle in pg.bundles:
                if is_placed(bundle):
                    out.setdefault(bundle.node_id, []).append(bundle)
        return out

    def gang_requests(self) -> list[autoscaler_pb2.GangResourceRequest]:
        return [gang_request(pg) for pg in self.pending()]


def gang_request(pg: gcs_pb2.PlacementGroupTableData) -> autoscaler_pb2.GangResourceRequest:
    """One ``GangResourceRequest`` per pending PG, shaped as Ray 2.60 shapes it."""
    pg_hex = pg.placement_group_id.hex()
    strategy = common_pb2.PlacementStrategy.Name(pg.strategy)
    state = PG.PlacementGroupState.Name(pg.state)
    out = autoscaler_pb2.GangResourceRequest(details=f"{pg_hex}:{strategy}|{state}")
    constraint = None
    if pg.strategy == common_pb2.STRICT_SPREAD:
        constraint = autoscaler_pb2.PlacementConstraint(
            anti_affinity=autoscaler_pb2.AntiAffinityConstraint(label_name=f"_PG_{pg_hex}")
        )
    elif pg.strategy == common_pb2.STRICT_PACK:
        constraint = autoscaler_pb2.PlacementConstraint(
            affinity=autoscaler_pb2.AffinityConstraint(label_name=f"_PG_{pg_hex}")
        )
    selector = out.bundle_selectors.add()
    for bundle in pg.bundles:
        if is_placed(bundle):
            continue  # placed already (only in RESCHEDULING groups)
        legacy = out.requests.add(resources_bundle=bundle.unit_resources)
        if constraint is not None:
            legacy.placement_constraints.append(constraint)
        request = selector.resource_requests.add()
        request.CopyFrom(legacy)
        if bundle.label_selector:
            request.label_selectors.append(parse_selector(bundle.label_selector))
    return out
