"""One reconcile round: observe, then act (Ray 2.60 §2.4), and report.

``Reconciler.reconcile_once`` lists the cloud (a pure read), runs the provider's upkeep
step if it declares one (KubeRay writes completed resizes to the raylets there, so the GCS
read that follows already shows them), reads the GCS, runs the sync steps (mirror what they
report), then the step phase (timeouts, the scheduler's decisions, terminations,
launches), each step applied as its own instance-manager batch against the version it
read.  Any failure aborts this round only (:class:`RoundAborted`); the loop
(:meth:`~gcs.autoscaler.runtime.AutoscalerRuntime.run`, sleeping on the injected clock)
logs it, counts it and tries again next interval.

The scheduler runs in a worker thread so a large snapshot never holds the event loop.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import structlog

from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.gcs_api import AutoscalerGcs
from gcs.autoscaler.instances.manager import InstanceManager
from gcs.autoscaler.instances.model import InstanceUpdate
from gcs.autoscaler.providers.base import (
    CloudInstance,
    CloudProvider,
    LaunchNodeError,
    TerminateNodeError,
)
from gcs.autoscaler.reconciler import steps, vc_scaling
from gcs.autoscaler.reconciler.events import EventLog
from gcs.autoscaler.reconciler.explanations import CapacityWatch, DecisionNotes
from gcs.autoscaler.reconciler.inputs import Memo, scheduling_input
from gcs.autoscaler.reconciler.observed import RayNodeReader, ReconcileConfig
from gcs.autoscaler.reconciler.report import autoscaling_state
from gcs.autoscaler.reconciler.subscribers import CloudInstanceUpdater, RayStopper
from gcs.base.clock import Clock, within
from gcs.policy.autoscaling.capacity import UnavailableCapacity
from gcs.policy.autoscaling.model import InstanceStatus, NodeKind, RayNode, RayNodeStatus
from gcs.policy.autoscaling.scheduler import schedule
from gcs.policy.autoscaling.scheduler.types import SchedulingInput, SchedulingReply
from gcs.policy.autoscaling.scheduler.waiting import WaitingDemand
from gcs.proto import autoscaler_pb2

log = structlog.get_logger("gcs.autoscaler")

Scheduler = Callable[[SchedulingInput], SchedulingReply]
_LIVE_RAY = (RayNodeStatus.RUNNING, RayNodeStatus.IDLE)
S_ALLOCATED = InstanceStatus.ALLOCATED
_GIVEN_UP = frozenset({InstanceStatus.ALLOCATION_TIMEOUT, InstanceStatus.RAY_INSTALL_FAILED})
"""Timeouts that end an instance (a machine that never brought Ray up): said as events."""


class RoundAborted(Exception):
    """A step could not be applied; nothing after it ran this round."""


@dataclass(slots=True)
class RoundResult:
    state: autoscaler_pb2.AutoscalingState
    reply: SchedulingReply | None
    warnings: list[str] = field(default_factory=list)
    #: Why each piece of demand waits (the primary's and every planned cluster's).
    waiting: tuple[WaitingDemand, ...] = ()


def _new_id() -> str:
    return uuid.uuid4().hex


class Reconciler:
    def __init__(
        self,
        *,
        instances: InstanceManager,
        provider: CloudProvider,
        gcs: AutoscalerGcs,
        cluster: ClusterConfig,
        clock: Clock,
        events: EventLog,
        updater: CloudInstanceUpdater,
        stopper: RayStopper,
        config: ReconcileConfig | None = None,
        scheduler: Scheduler = schedule,
        new_instance_id: Callable[[], str] = _new_id,
        new_request_id: Callable[[], str] = _new_id,
        provider_timeout_s: float = 30.0,
        schedule_in_thread: bool = True,
        vc_update_attempts: int = 3,
        capacity: UnavailableCapacity | None = None,
    ) -> None:
        """What the provider does beyond the contract (read-only, in-place resize, upkeep,
        a cluster config re-read every round) is what its ``capabilities`` declare.
        ``capacity``: the unavailable-capacity cache (default: one with the config's
        ``capacity_backoff``)."""
        self._im = instances
        self._provider = provider
        self._capabilities = provider.capabilities
        self._gcs = gcs
        self.cluster = cluster
        self._clock = clock
        self.events = events
        self._updater = updater
        self._stopper = stopper
        self.config = config or ReconcileConfig(upscaling_speed=cluster.upscaling_speed)
        self._scheduler = scheduler
        self._new_instance_id = new_instance_id
        self._new_request_id = new_request_id
        self._provider_timeout_s = provider_timeout_s
        self._in_thread = schedule_in_thread
        self._carry_last_work: dict[str, float] = {}
        self._carry_pending: dict[str, tuple[float, ...]] = {}
        self.vc_update_attempts = vc_update_attempts
        self.capacity = CapacityWatch(
            capacity or UnavailableCapacity(cluster.capacity_backoff), events
        )
        self._decision_notes = DecisionNotes(events)
        self._vc_noted: dict[str, str] = {}
        self._ray_nodes = RayNodeReader()
        self._input_memo: Memo = {}
        self.waiting: tuple[WaitingDemand, ...] = ()
        """The last round's verdicts on waiting demand (published, exported as metrics)."""
        self.rounds = 0
        self.failed_rounds = 0
        self.last_error = ""

    # -- one round, as the loop runs it ---------------------------------------------------
    async def reconcile_safely(self) -> RoundResult | None:
        """:meth:`reconcile_once`; a failure is logged and counted, and costs this round."""
        try:
            return await self.reconcile_once()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self.failed_rounds += 1
            self.last_error = f"{type(err).__name__}: {err}"
            log.warning("autoscaler.round_failed", error=self.last_error)
            return None

    # -- one round ------------------------------------------------------------------------
    async def reconcile_once(self) -> RoundResult:
        self.rounds += 1
        await self._im.ensure_loaded()
        caps = self._capabilities
        cloud = await self._list_cloud()
        if caps.upkeep is not None:
            await caps.upkeep.upkeep()
        for line in caps.notices() if caps.notices is not None else ():
            self.events.add("provider", line)
        state = await self._gcs.get_cluster_resource_state()
        ray_nodes = self._ray_nodes.read(state)
        if caps.config_source is not None:
            self.cluster = caps.config_source() or self.cluster
        errors = [*self._provider.poll_errors(), *self._updater.poll_errors()]
        launch_errors = [e for e in errors if isinstance(e, LaunchNodeError)]
        term_errors = [e for e in errors if isinstance(e, TerminateNodeError)]
        stop_errors = self._stopper.poll_errors()
        read_only = caps.read_only

        # sync: mirror what the cloud and Ray report
        allocations = steps.allocate(self._im.instances, cloud, launch_errors)
        await self._step("allocate", allocations)
        allocated = (u.instance_type for u in allocations if u.new_status is S_ALLOCATED)
        self.capacity.observe(launch_errors, allocated, self._clock.now_s())
        await self._step("cloud-terminated", steps.cloud_terminated(self._im.instances, cloud))
        await self._step(
            "termination-errors", steps.termination_errors(self._im.instances, term_errors)
        )
        await self._step(
            "adopt",
            steps.adopt_extra(self._im.instances, ray_nodes, cloud, self._new_instance_id),
        )
        await self._step(
            "ray-status", steps.ray_status(self._im.instances, ray_nodes, read_only=read_only)
        )
        await self._step("stop-failed", steps.stop_failed(self._im.instances, stop_errors))

        # step: act
        await self._step(
            "missing-ray-nodes",
            steps.missing_ray_nodes(self._im.instances, {n.node_id for n in ray_nodes}),
        )
        now_ns = int(self._clock.now_s() * 1e9)
        stuck, warnings = steps.stuck(self._im.instances, self.config, now_ns)
        for line in warnings:
            log.warning("autoscaler.instance_stuck", detail=line)
        await self._step("stuck", stuck)
        for upd in stuck:
            gave_up = self._im.instances.get(upd.instance_id)
            if upd.new_status in _GIVEN_UP and gave_up is not None:
                self.events.add(
                    "timeout",
                    f"Giving up on {gave_up.cloud_instance_id or upd.instance_id} "
                    f"({gave_up.instance_type}): {upd.details}; it is terminated",
                )
        scaling = not read_only and self._head_running(ray_nodes)
        plan = vc_scaling.plan_virtual_clusters(
            state, self._im.instances, ray_nodes, self.cluster, now_ns / 1e9, self._scheduler
        )
        held = set(plan.held)
        holders = steps.vc_held_nodes(state)
        if scaling:
            for grow in plan.grows:
                moved = await self._grow(grow)
                held |= moved
                holders.update(dict.fromkeys(moved, grow.cluster_id))
        for cluster_id, idle in plan.releases.items():
            await self._release(cluster_id, list(idle))
        self._note_vc_decisions(plan)
        await self._cancel_held_back(now_ns / 1e9)
        reply = await self._schedule(
            vc_scaling.primary_demand(state, plan.planned), ray_nodes, frozenset(held)
        )
        reply, release = steps.hold_back_vc_nodes(reply, holders, plan.planned)
        self.waiting = vc_scaling.waiting_demand(reply, plan)
        for cluster_id, node_ids in vc_scaling.within_floor(state, release, ray_nodes).items():
            await self._release(cluster_id, node_ids)
        if scaling:
            await self._step("scale", steps.scale(self._im.instances, reply, self._new_instance_id))
            await self._step(
                "vc-launch", vc_scaling.launch_updates(plan.launches, self._new_instance_id)
            )
            for launch in plan.launches:
                self.events.add(
                    "vc-launch",
                    f"Queued {launch.count} x {launch.node_type} for virtual cluster "
                    f"{launch.cluster_id}: {launch.reason}",
                )
        if not read_only and caps.resizer is not None:
            await caps.resizer.resize(reply.resizes, ray_nodes)
        await self._step("terminate", steps.terminate_finished(self._im.instances))
        if not read_only:
            await self._cancel_held_back(now_ns / 1e9)  # e.g. a virtual cluster's launch
            await self._step(
                "launch", steps.launches(self._im.instances, self.config, self._new_request_id)
            )

        report = autoscaling_state(
            self._im.instances, reply, im_version=self._im.version, cluster_state=state
        )
        await self._gcs.report_autoscaling_state(report)
        return RoundResult(report, reply, warnings, self.waiting)

    async def _list_cloud(self) -> dict[str, CloudInstance]:
        try:
            return dict(
                await within(
                    self._clock, self._provider_timeout_s, self._provider.get_non_terminated()
                )
            )
        except TimeoutError:
            raise RoundAborted(
                f"provider did not list instances within {self._provider_timeout_s:g} s"
            ) from None

    async def _release(self, cluster_id: str, node_ids: list[str]) -> None:
        """Idle nodes of a virtual cluster go back to the primary before any termination."""
        try:
            await self._gcs.release_nodes(cluster_id, node_ids)
        except Exception as err:  # the nodes stay where they are; next round tries again
            log.warning("autoscaler.release_failed", cluster=cluster_id, error=str(err))
            return
        short = ", ".join(n[:8] for n in node_ids)
        self.events.add(
            "release", f"Released idle node(s) {short} from virtual cluster {cluster_id}"
        )

    async def _grow(self, grow: vc_scaling.VcGrow) -> set[str]:
        """Move free primary nodes into a virtual cluster: CreateOrUpdate with the revision
        just read; a stale revision (someone else changed it) is re-read and retried.
        Returns the nodes moved in."""
        for attempt in range(1, self.vc_update_attempts + 1):
            try:
                snap = await self._gcs.read_virtual_cluster(grow.cluster_id)
                if snap is None:
                    return set()
                want = dict(snap.replica_sets)
                for node_type, count in grow.add.items():
                    want[node_type] = want.get(node_type, 0) + count
                result = await self._gcs.update_virtual_cluster(
                    grow.cluster_id,
                    divisible=snap.divisible,
                    replica_sets=want,
                    revision=snap.revision,
                )
            except Exception as err:  # the demand stays; next round tries again
                log.warning("autoscaler.vc_grow_failed", cluster=grow.cluster_id, error=str(err))
                self.events.add("vc-failed", f"Virtual cluster {grow.cluster_id}: {err}")
                return set()
            if result.ok:
                moved = set(result.nodes - snap.nodes)
                short = ", ".join(sorted(n[:8] for n in moved))
                self.events.add(
                    "vc-move",
                    f"Moved node(s) {short} into virtual cluster {grow.cluster_id}: {grow.reason}",
                )
                return moved
            if not result.expired:
                self.events.add(
                    "vc-failed",
                    f"Could not grow virtual cluster {grow.cluster_id}: {result.message}",
                )
                return set()
            log.info("autoscaler.vc_revision_conflict", cluster=grow.cluster_id, attempt=attempt)
        self.events.add(
            "vc-failed",
            f"Virtual cluster {grow.cluster_id} changed under every one of "
            f"{self.vc_update_attempts} attempts; trying again next round",
        )
        return set()

    def _note_vc_decisions(self, plan: vc_scaling.VcPlan) -> None:
        """Caps and infeasible VC demand as events, once per change (not every round)."""
        for d in plan.decisions:
            line = f"Virtual cluster {d.subject}: {d.reason}"
            if self._vc_noted.get(d.subject) != line:
                self._vc_noted[d.subject] = line
                self.events.add(f"vc-{d.action}", line)

    def _head_running(self, ray_nodes: Sequence[RayNode]) -> bool:
        """Ray scales only once a head runs.  Ours also accepts a live head Ray node that no
        provider manages (a head started by hand, with the standalone autoscaler)."""
        if any(n.is_head and n.status in _LIVE_RAY for n in ray_nodes):
            return True
        return any(
            i.node_kind is NodeKind.HEAD and i.status is InstanceStatus.RAY_RUNNING
            for i in self._im.instances.values()
        )

    async def _schedule(
        self,
        state: autoscaler_pb2.ClusterResourceState,
        ray_nodes: Sequence[RayNode],
        held: frozenset[str] = frozenset(),
    ) -> SchedulingReply:
        resizer = self._capabilities.resizer
        ippr = resizer.ippr_statuses() if resizer is not None else None
        inp = scheduling_input(
            state,
            self._im.instances,
            ray_nodes,
            self.cluster,
            self._clock.now_s(),
            memo=self._input_memo,
            ippr=ippr,
        )
        inp = vc_scaling.hide_held_capacity(inp, held)
        inp = replace(
            inp,
            last_work_s=self._carry_last_work,
            pending_since_s=self._carry_pending,
            unavailable_types=self.capacity.unavailable(inp.now_s),
        )
        if self._in_thread:
            reply = await asyncio.to_thread(self._scheduler, inp)
        else:
            reply = self._scheduler(inp)
        self._carry_last_work = dict(reply.last_work_s)
        self._carry_pending = dict(reply.pending_since_s)
        self._decision_notes.note(reply.reasons)
        for decision in reply.reasons:
            log.debug(
                "autoscaler.decision",
                action=decision.action,
                subject=decision.subject,
                reason=decision.reason,
            )
        return reply

    async def _cancel_held_back(self, now_s: float) -> None:
        """Queued launches of a node type the cloud just refused are not requested."""
        await self._step("capacity-cancel", self.capacity.cancel_queued(self._im.instances, now_s))

    async def _step(self, name: str, updates: Sequence[InstanceUpdate]) -> None:
        if not updates:
            return
        result = await self._im.update(list(updates), expected_version=self._im.version)
        if not result.ok:
            raise RoundAborted(f"step {name}: {result.status.value} {result.message}")
