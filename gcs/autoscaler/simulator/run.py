"""Run the real reconciler and scheduler against the simulated world on a virtual clock.

Quiet rounds are skipped: when the last round changed nothing (no instance update, no
change in the world, no provider error to report) and nothing changed since, the next
round is the same computation on the same inputs and would change nothing either, unless
time alone makes a difference: an idle node passing its idle timeout, an instance passing
a status timeout, or a launched instance appearing in the cloud's listing once its launch
delay is over.  The runner computes the earliest such moment (:func:`_idle_wake`,
:func:`_instance_wake`, ``SimCloud.next_appearance``) and runs every round from then on.

Rounds in which tasks only finished are skipped too when that cannot matter: no task is
pending (no demand, before or after), every instance is settled (running Ray or gone: no
drain, launch or timeout in flight) and idle clocks are Ray's (no ``own_idle_clock``).
Freed capacity then changes a decision only once a node that went idle passes its idle
timeout, which moves the wake time.

A node type held back by the unavailable-capacity cache is the same kind of clock: when its
hold ends the next round may launch it (``next_change_s`` of the cache).

This is what makes a simulated day of a 500-node cluster take seconds.  Exactness rests
on the reconciler spending nothing in a round that changes nothing (e.g. it draws a launch
request id only when it requests a launch: ids order ties).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace

from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.instances import InstanceManager, MemoryInstanceStorage
from gcs.autoscaler.reconciler import (
    CloudInstanceUpdater,
    EventLog,
    RayStopper,
    ReconcileConfig,
    Reconciler,
)
from gcs.autoscaler.simulator.workload import Workload
from gcs.autoscaler.simulator.world import SimCloud, SimRay
from gcs.base.clock import FakeClock
from gcs.policy.autoscaling.model import InstanceStatus as S

PENDING = frozenset({S.QUEUED, S.REQUESTED, S.ALLOCATED, S.RAY_INSTALLING})
SETTLED = frozenset({S.RAY_RUNNING, S.TERMINATED, S.ALLOCATION_FAILED})
STOPPING = frozenset({S.RAY_STOP_REQUESTED, S.RAY_STOPPING, S.RAY_STOPPED, S.TERMINATING})


@dataclass
class Sample:
    t_s: float
    nodes_by_type: dict[str, int]
    pending_instances: int
    running_instances: int
    stopping_instances: int
    pending_tasks: int
    cpu_used: float
    cpu_total: float
    idle_nodes: int
    used: dict[str, float] = field(default_factory=dict)
    """Per resource kind (CPU, GPU, memory, ...) over alive nodes."""
    total: dict[str, float] = field(default_factory=dict)
    demand: dict[str, float] = field(default_factory=dict)
    """What waiting tasks ask for, per resource kind."""


@dataclass
class SimResult:
    samples: list[Sample] = field(default_factory=list)
    events: list[tuple[float, str, str]] = field(default_factory=list)
    launched: int = 0
    failed_launches: int = 0
    terminated: int = 0
    failed_rounds: int = 0
    tasks_started: int = 0
    tasks_total: int = 0
    pending_task_s: float = 0.0
    batch_latency_s: list[float] = field(default_factory=list)
    unfinished_batches: int = 0
    interval_s: float = 5.0
    skipped_rounds: int = 0
    #: The part of ``skipped_rounds`` in which tasks finished (see module doc).
    skipped_finish_rounds: int = 0
    #: (time, node type, instances, kind) of every failed launch.
    failures: list[tuple[float, str, int, str]] = field(default_factory=list)
    #: Node type -> the cloud's capacity for it (the workload's ``cloud.capacity``).
    cloud_capacity: dict[str, int] = field(default_factory=dict)
    #: Worker cap of the cluster (``max_workers``; None = none) and per type.
    max_workers: int | None = None
    type_max_workers: dict[str, int] = field(default_factory=dict)
    #: Resources of one node of each type.
    type_resources: dict[str, dict[str, float]] = field(default_factory=dict)
    head_type: str = ""


async def simulate(
    cluster: ClusterConfig,
    workload: Workload,
    *,
    progress: bool = False,
    reconcile: ReconcileConfig | None = None,
    skip_quiet: bool = True,
) -> SimResult:
    clock = FakeClock(start_s=0.0)
    cloud = SimCloud(clock, workload.cloud)
    ray = SimRay(clock, cluster, cloud, workload.cloud)
    cloud.add_head(cluster.head_node_type)
    events = EventLog(clock, capacity=100_000)
    updater = CloudInstanceUpdater(cloud, clock, events)
    stopper = RayStopper(ray, events)
    im = InstanceManager(MemoryInstanceStorage(), clock, subscribers=[updater, stopper])
    ids = itertools.count(1)
    reconciler = Reconciler(
        instances=im,
        provider=cloud,
        gcs=ray,
        cluster=cluster,
        clock=clock,
        events=events,
        updater=updater,
        stopper=stopper,
        config=reconcile or ReconcileConfig(upscaling_speed=cluster.upscaling_speed),
        new_instance_id=lambda: f"i-{next(ids)}",
        new_request_id=lambda: f"r-{next(ids)}",
        schedule_in_thread=False,
    )
    result = SimResult(interval_s=workload.interval_s)
    rounds = int(workload.duration_s // workload.interval_s) + 1
    batches = list(workload.batches)
    next_batch = 0
    quiet, seen_changes, seen_finishes, wake_at = False, -1, -1, 0.0
    settled, instance_wake = False, math.inf
    own_idle_clock = cluster.scheduler.options.own_idle_clock
    sampled_at: tuple[int, int] = (-1, -1)
    last_sample = Sample(0.0, {}, 0, 0, 0, 0, 0.0, 0.0, 0)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=rounds, unit="round", desc="simulating", leave=False)
    try:
        for n in range(rounds):
            now = n * workload.interval_s
            clock.advance(now - clock.now_s())
            while next_batch < len(batches) and batches[next_batch].at_s <= now:
                ray.arrive(next_batch, batches[next_batch])
                result.tasks_total += batches[next_batch].count
                next_batch += 1
            ray.step(now)
            unchanged = ray.changes == seen_changes
            only_finished = (
                settled
                and ray.changes - seen_changes == ray.finishes - seen_finishes
                and ray.pending_count() == 0
            )
            if skip_quiet and quiet and now < wake_at and (unchanged or only_finished):
                result.skipped_rounds += 1  # provably a no-op round (see module doc)
                if not unchanged:
                    result.skipped_finish_rounds += 1
                    wake_at = min(instance_wake, _idle_wake(ray, cluster))
            else:
                before = (ray.changes, im.version)
                if await reconciler.reconcile_safely() is None:
                    result.failed_rounds += 1
                await updater.settle()
                await stopper.settle()
                ray.step(now)
                seen_changes, seen_finishes = ray.changes, ray.finishes
                quiet = before == (ray.changes, im.version) and not cloud.has_errors()
                settled = quiet and not own_idle_clock and _all_settled(im)
                if quiet:
                    instance_wake = min(
                        _instance_wake(im, cluster, reconciler.config),
                        cloud.next_appearance(),
                        reconciler.capacity.cache.next_change_s(now),
                    )
                    wake_at = min(instance_wake, _idle_wake(ray, cluster))
                else:
                    wake_at = 0.0
            if sampled_at != (ray.changes, im.version):  # else the same but for the time
                last_sample = _sample(now, ray, im)
                sampled_at = (ray.changes, im.version)
            result.samples.append(replace(last_sample, t_s=now))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    await asyncio.sleep(0)
    result.events = [(e.time_s, e.kind, e.message) for e in events.recent(100_000)]
    result.launched = cloud.launched
    result.failed_launches = cloud.failed
    result.failures = [(t, node_type, n, kind.value) for t, node_type, n, kind in cloud.failures]
    result.cloud_capacity = dict(workload.cloud.capacity)
    sched = cluster.scheduler
    result.max_workers = None if sched.max_num_nodes is None else sched.max_num_nodes - 1
    result.head_type = cluster.head_node_type
    result.type_max_workers = {
        t: cfg.max_workers for t, cfg in sched.node_types.items() if t != cluster.head_node_type
    }
    result.type_resources = {t: dict(cfg.resources) for t, cfg in sched.node_types.items()}
    result.terminated = cloud.terminated
    result.tasks_started = ray.started
    result.pending_task_s = ray.wait_s_total + sum(
        (workload.duration_s - arrived) for q in ray.pending.values() for arrived, _ in q
    )
    for index, arrival in ray.batch_arrival.items():
        done = ray.batch_done_at.get(index)
        if done is None:
            result.unfinished_batches += 1
        else:
            result.batch_latency_s.append(done - arrival)
    return result


def _sample(now: float, ray: SimRay, im: InstanceManager) -> Sample:
    by_type: Counter[str] = Counter()
    used: defaultdict[str, float] = defaultdict(float)
    total: defaultdict[str, float] = defaultdict(float)
    idle = 0
    for node in ray.nodes.values():
        if node.dead:
            continue
        by_type[node.node_type] += 1
        for name, amount in node.total.items():
            if name.startswith("node:"):
                continue
            total[name] += amount
            used[name] += amount - node.available.get(name, 0.0)
        if node.running == 0 and not node.is_head:
            idle += 1
    statuses = Counter(i.status for i in im.instances.values())
    return Sample(
        t_s=now,
        nodes_by_type=dict(by_type),
        pending_instances=sum(statuses[s] for s in PENDING),
        running_instances=statuses[S.RAY_RUNNING],
        stopping_instances=sum(statuses[s] for s in STOPPING),
        pending_tasks=ray.pending_count(),
        cpu_used=used["CPU"],
        cpu_total=total["CPU"],
        idle_nodes=idle,
        used=dict(used),
        total=dict(total),
        demand=ray.pending_demand(),
    )


_TIMED = {
    S.REQUESTED: "request_status_timeout_s",
    S.ALLOCATED: "allocate_status_timeout_s",
    S.RAY_INSTALLING: "ray_install_status_timeout_s",
    S.TERMINATING: "terminating_status_timeout_s",
    S.RAY_STOP_REQUESTED: "ray_stop_requested_status_timeout_s",
}


def _all_settled(im: InstanceManager) -> bool:
    return all(i.status in SETTLED for i in im.instances.values())


def _idle_wake(ray: SimRay, cluster: ClusterConfig) -> float:
    """When the first idle node passes its idle timeout."""
    wake = math.inf
    sched = cluster.scheduler
    for node in ray.nodes.values():
        if node.dead or node.running or node.is_head:
            continue
        type_cfg = sched.node_types.get(node.node_type)
        timeout = (
            type_cfg.idle_timeout_s
            if type_cfg and type_cfg.idle_timeout_s is not None
            else sched.idle_timeout_s
        )
        if timeout is not None:
            wake = min(wake, node.idle_since_s + timeout)
    return wake


def _instance_wake(im: InstanceManager, cluster: ClusterConfig, cfg: ReconcileConfig) -> float:
    """When the first instance passes a status timeout (or the pending-idle timeout)."""
    wake = math.inf
    pending_idle = cluster.scheduler.pending_idle_timeout_s
    for inst in im.instances.values():
        entered = (inst.entered_at_ns() or 0) / 1e9
        attr = _TIMED.get(inst.status)
        if attr is not None:
            wake = min(wake, entered + getattr(cfg, attr))
        if pending_idle is not None and inst.status in PENDING:
            wake = min(wake, entered + pending_idle)
    return wake
