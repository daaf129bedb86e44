"""The reconcile steps of Ray 2.60 (§2.4) as pure functions: instances + observations in,
instance updates out.  The reconciler applies each step's updates as one batch before the
next step reads the instances again.  Ids and time are passed in.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from gcs.autoscaler.instances.model import Instance, InstanceUpdate, TerminationCause
from gcs.autoscaler.instances.transitions import (
    CLOUD_ALLOCATED_STATUSES,
    TERMINAL_STATUSES,
    VALID_TRANSITIONS,
    reachable_from,
)
from gcs.autoscaler.providers.base import CloudInstance, LaunchNodeError, TerminateNodeError
from gcs.autoscaler.reconciler.observed import ReconcileConfig
from gcs.policy.autoscaling.model import InstanceStatus as S
from gcs.policy.autoscaling.model import NodeKind, RayNode, RayNodeStatus
from gcs.policy.autoscaling.scheduler.types import SchedulingReply
from gcs.policy.virtual_clusters.ids import PRIMARY_CLUSTER_ID
from gcs.proto import autoscaler_pb2

NewId = Callable[[], str]

_DEAD_ROWS = frozenset({S.TERMINATED, S.ALLOCATION_FAILED})


def _entered(inst: Instance, status: S | None = None) -> int:
    return inst.entered_at_ns(status) or 0


def _live(instances: Iterable[Instance]) -> list[Instance]:
    return [i for i in instances if i.status not in _DEAD_ROWS]


# -- sync phase (passive: mirror what the cloud and Ray report) ---------------------------
def allocate(
    instances: Mapping[str, Instance],
    cloud: Mapping[str, CloudInstance],
    launch_errors: Sequence[LaunchNodeError],
) -> list[InstanceUpdate]:
    """Step 1: REQUESTED -> ALLOCATED on an unassigned cloud instance of its type, or
    ALLOCATION_FAILED up to the count of launch errors for (request id, type)."""
    owned = {i.cloud_instance_id for i in _live(instances.values()) if i.cloud_instance_id}
    free: dict[str, list[CloudInstance]] = defaultdict(list)
    for cid, ci in cloud.items():
        if cid not in owned:
            free[ci.node_type].append(ci)
    failures: dict[tuple[str, str], int] = defaultdict(int)
    details: dict[tuple[str, str], str] = {}
    for err in launch_errors:
        failures[(err.request_id, err.node_type)] += err.count
        details[(err.request_id, err.node_type)] = err.details
    requested = sorted(
        (i for i in instances.values() if i.status is S.REQUESTED),
        key=lambda i: (_entered(i, S.REQUESTED), i.instance_id),
    )
    out = []
    for inst in requested:
        pool = free.get(inst.instance_type)
        if pool:
            ci = pool.pop()
            out.append(
                InstanceUpdate(
                    inst.instance_id,
                    S.ALLOCATED,
                    details=f"allocated cloud instance {ci.cloud_instance_id}",
                    cloud_instance_id=ci.cloud_instance_id,
                    node_kind=ci.node_kind,
                    instance_type=ci.node_type,
                )
            )
            continue
        key = (inst.launch_request_id, inst.instance_type)
        if failures.get(key, 0) > 0:
            failures[key] -= 1
            out.append(
                InstanceUpdate(
                    inst.instance_id,
                    S.ALLOCATION_FAILED,
                    details=details[key] or "the provider failed to launch it",
                )
            )
    return out


def cloud_terminated(
    instances: Mapping[str, Instance], cloud: Mapping[str, CloudInstance]
) -> list[InstanceUpdate]:
    """Step 2: an instance whose cloud instance is gone is TERMINATED."""
    return [
        InstanceUpdate(
            i.instance_id,
            S.TERMINATED,
            details=f"cloud instance {i.cloud_instance_id} is terminated",
            cloud_instance_id=i.cloud_instance_id,
        )
        for i in instances.values()
        if i.cloud_instance_id
        and i.status not in TERMINAL_STATUSES
        and i.status in CLOUD_ALLOCATED_STATUSES
        and i.cloud_instance_id not in cloud
    ]


def termination_errors(
    instances: Mapping[str, Instance], errors: Sequence[TerminateNodeError]
) -> list[InstanceUpdate]:
    """Step 3: TERMINATING with a terminate error -> TERMINATION_FAILED (retried later)."""
    terminating = {i.cloud_instance_id: i for i in instances.values() if i.status is S.TERMINATING}
    out: dict[str, InstanceUpdate] = {}
    for err in errors:
        inst = terminating.get(err.cloud_instance_id)
        if inst is not None:
            out[inst.instance_id] = InstanceUpdate(
                inst.instance_id, S.TERMINATION_FAILED, details=err.details or "terminate failed"
            )
    return list(out.values())


def adopt_extra(
    instances: Mapping[str, Instance],
    ray_nodes: Sequence[RayNode],
    cloud: Mapping[str, CloudInstance],
    new_id: NewId,
) -> list[InstanceUpdate]:
    """Step 4: Ray nodes and cloud instances nobody tracks become ALLOCATED instances
    (so a restarted autoscaler adopts what it launched before, instead of leaking it)."""
    rows = list(instances.values())
    known_nodes = {i.node_id for i in rows if i.node_id}
    waiting = {
        i.cloud_instance_id
        for i in rows
        if i.cloud_instance_id and not i.node_id and i.status not in _DEAD_ROWS
    }
    out: list[InstanceUpdate] = []
    # (a) Ray nodes on a cloud instance, unknown by node id.  Only instances the provider
    # lists: a Ray node on a machine the provider does not run (started by hand, another
    # tool's) is not ours to adopt -- Ray adopts it and step 2 then marks it TERMINATED,
    # every round anew.
    for node in ray_nodes:
        if not node.instance_id or node.node_id in known_nodes or node.instance_id not in cloud:
            continue
        if node.instance_id in waiting:
            continue  # an instance waits for this node's raylet: step 5 matches it
        iid = new_id()
        upd = InstanceUpdate(
            iid,
            S.ALLOCATED,
            upsert=True,
            details=f"adopted Ray node {node.node_id}",
            cloud_instance_id=node.instance_id,
            node_kind=NodeKind.HEAD
            if node.is_head or cloud[node.instance_id].node_kind is NodeKind.HEAD
            else NodeKind.WORKER,
            instance_type=node.node_type or _cloud_type(cloud, node.instance_id),
            ray_node_id=node.node_id,
        )
        out.append(upd)
        known_nodes.add(node.node_id)
        rows.append(
            Instance(
                iid,
                S.ALLOCATED,
                upd.instance_type,
                cloud_instance_id=node.instance_id,
                node_id=node.node_id,
            )
        )
    # (b) cloud instances no live instance owns.
    owned = {i.cloud_instance_id for i in _live(rows) if i.cloud_instance_id}
    for cid, ci in cloud.items():
        if cid in owned:
            continue
        out.append(
            InstanceUpdate(
                new_id(),
                S.ALLOCATED,
                upsert=True,
                details=f"adopted cloud instance {cid}",
                cloud_instance_id=cid,
                node_kind=ci.node_kind,
                instance_type=ci.node_type,
            )
        )
        owned.add(cid)
    return [u for u in out if u.instance_type]


def _cloud_type(cloud: Mapping[str, CloudInstance], cid: str) -> str:
    ci = cloud.get(cid)
    return ci.node_type if ci else ""


class UnknownRayNodeStatus(ValueError):
    """A Ray node reported UNSPECIFIED: the round is aborted (Ray raises too)."""


_FROM_RAY = {
    RayNodeStatus.RUNNING: S.RAY_RUNNING,
    RayNodeStatus.IDLE: S.RAY_RUNNING,
    RayNodeStatus.DEAD: S.RAY_STOPPED,
    RayNodeStatus.DRAINING: S.RAY_STOPPING,
}


def ray_status(
    instances: Mapping[str, Instance], ray_nodes: Sequence[RayNode], *, read_only: bool = False
) -> list[InstanceUpdate]:
    """Step 5: mirror each Ray node's status onto its instance (never backwards)."""
    by_node: dict[str, Instance] = {}
    by_cloud: dict[str, Instance] = {}
    for row in sorted(instances.values(), key=lambda i: i.status not in TERMINAL_STATUSES):
        # live rows sort last, so they win a shared node or cloud id
        if row.node_id:
            by_node[row.node_id] = row
        if row.cloud_instance_id:
            by_cloud[row.cloud_instance_id] = row
    out: dict[str, InstanceUpdate] = {}
    for node in ray_nodes:
        target = _FROM_RAY.get(node.status)
        if target is None:
            raise UnknownRayNodeStatus(f"Ray node {node.node_id} has status UNSPECIFIED")
        inst: Instance | None = by_node.get(node.node_id)
        if inst is None:
            cloud_id = node.node_id if read_only else node.instance_id
            inst = by_cloud.get(cloud_id) if cloud_id else None
        if inst is None:
            continue
        if inst.status == target or inst.status in reachable_from(target):
            continue
        out[inst.instance_id] = InstanceUpdate(
            inst.instance_id,
            target,
            details=f"Ray node {node.node_id} is {node.status.name}",
            ray_node_id=node.node_id,
        )
    return list(out.values())


def stop_failed(
    instances: Mapping[str, Instance], stop_errors: Mapping[str, str]
) -> list[InstanceUpdate]:
    """Step 7: a drain the raylet rejected: RAY_STOP_REQUESTED -> back to RAY_RUNNING."""
    return [
        InstanceUpdate(iid, S.RAY_RUNNING, details=why, ray_node_id=i.node_id)
        for iid, why in stop_errors.items()
        if (i := instances.get(iid)) is not None and i.status is S.RAY_STOP_REQUESTED and i.node_id
    ]


# -- step phase (active) ----------------------------------------------------------------
_HAS_RAY_NODE = frozenset({S.RAY_RUNNING, S.RAY_STOP_REQUESTED, S.RAY_STOPPING})


def missing_ray_nodes(
    instances: Mapping[str, Instance], gcs_node_ids: set[str]
) -> list[InstanceUpdate]:
    """Step 8: a non-head instance whose Ray node the GCS no longer lists: RAY_STOPPED."""
    return [
        InstanceUpdate(
            i.instance_id,
            S.RAY_STOPPED,
            details=f"Ray node {i.node_id} is missing from the GCS",
            ray_node_id=i.node_id,
        )
        for i in instances.values()
        if i.status in _HAS_RAY_NODE
        and i.node_kind is not NodeKind.HEAD
        and i.node_id
        and i.node_id not in gcs_node_ids
    ]


_WARN_ONLY = frozenset(
    {S.RAY_STOPPING, S.RAY_INSTALL_FAILED, S.RAY_STOPPED, S.TERMINATION_FAILED, S.QUEUED}
)


#: Status -> (its timeout in ReconcileConfig, the status a timeout leads to, what happened).
#: REQUESTED is special: it is retried (back to QUEUED) until the retries run out.
_TIMEOUTS: Mapping[S, tuple[str, S, str]] = {
    S.ALLOCATED: ("allocate_status_timeout_s", S.ALLOCATION_TIMEOUT, "no Ray node within"),
    S.RAY_INSTALLING: (
        "ray_install_status_timeout_s", S.RAY_INSTALL_FAILED, "Ray not installed within"
    ),
    S.TERMINATING: ("terminating_status_timeout_s", S.TERMINATION_FAILED, "not terminated within"),
    S.RAY_STOP_REQUESTED: (
        "ray_stop_requested_status_timeout_s", S.RAY_RUNNING, "drain not done within"
    ),
}  # fmt: skip


_TIMED_STATUSES = frozenset({S.REQUESTED, *_TIMEOUTS, *_WARN_ONLY})


def stuck(
    instances: Mapping[str, Instance], cfg: ReconcileConfig, now_ns: int
) -> tuple[list[InstanceUpdate], list[str]]:
    """Step 9: timeouts of §2.5.  Returns (updates, warnings)."""
    out: list[InstanceUpdate] = []
    warnings: list[str] = []
    for inst in instances.values():
        s, iid = inst.status, inst.instance_id
        if s not in _TIMED_STATUSES:
            continue
        age = (now_ns - _entered(inst)) / 1e9
        if s is S.REQUESTED and age > cfg.request_status_timeout_s:
            tries = inst.times_entered(S.REQUESTED)
            limit = cfg.request_status_timeout_s
            if tries > cfg.max_num_retry_request_to_allocate:
                why = f"no cloud instance after {tries} requests of {limit:g} s"
                out.append(InstanceUpdate(iid, S.ALLOCATION_FAILED, details=why))
            else:
                why = f"launch not allocated within {limit:g} s; retrying"
                out.append(InstanceUpdate(iid, S.QUEUED, details=why))
        elif s in _TIMEOUTS:
            attr, then, what = _TIMEOUTS[s]
            limit = getattr(cfg, attr)
            if age > limit:
                # back to RAY_RUNNING names the node again (a required field there)
                out.append(
                    InstanceUpdate(
                        iid, then, details=f"{what} {limit:g} s", ray_node_id=inst.node_id
                    )
                )
        elif s in _WARN_ONLY and age > cfg.transient_status_warn_interval_s:
            warnings.append(f"instance {iid} has been {s.name} for {age:.0f} s")
    return out, warnings


def scale(
    instances: Mapping[str, Instance], reply: SchedulingReply, new_id: NewId
) -> list[InstanceUpdate]:
    """Step 10: the scheduler's terminations and launches as instance updates."""
    out: list[InstanceUpdate] = []
    for term in reply.terminations:
        inst = instances.get(term.instance_id)
        if inst is None or inst.status in TERMINAL_STATUSES:
            continue
        cause = TerminationCause(term.cause.value, term.idle_duration_ms, term.reason)
        if inst.status is S.QUEUED:
            out.append(
                InstanceUpdate(
                    inst.instance_id, S.TERMINATED, details=f"allocation canceled: {term.reason}"
                )
            )
        elif inst.status in (S.ALLOCATED, S.RAY_INSTALLING):
            out.append(
                InstanceUpdate(
                    inst.instance_id,
                    S.TERMINATING,
                    details=term.reason,
                    cloud_instance_id=inst.cloud_instance_id,
                )
            )
        elif S.RAY_STOP_REQUESTED in VALID_TRANSITIONS[inst.status]:
            out.append(
                InstanceUpdate(
                    inst.instance_id,
                    S.RAY_STOP_REQUESTED,
                    details=term.reason,
                    termination=cause,
                )
            )
    for node_type, count in reply.launches.items():
        for _ in range(count):
            out.append(
                InstanceUpdate(
                    new_id(),
                    S.QUEUED,
                    upsert=True,
                    instance_type=node_type,
                    details="queued by the scheduler",
                )
            )
    return out


_TO_TERMINATE = frozenset(
    {S.RAY_STOPPED, S.ALLOCATION_TIMEOUT, S.RAY_INSTALL_FAILED, S.TERMINATION_FAILED}
)


def terminate_finished(instances: Mapping[str, Instance]) -> list[InstanceUpdate]:
    """Step 11: stopped or failed instances -> TERMINATING; a stale RAY_STOPPED row whose
    cloud instance another active row now owns (raylet restarted) -> TERMINATED directly."""
    active_clouds = {
        i.cloud_instance_id
        for i in instances.values()
        if i.cloud_instance_id and i.status not in _TO_TERMINATE and i.status not in _DEAD_ROWS
    }
    out = []
    for inst in instances.values():
        if inst.status not in _TO_TERMINATE:
            continue
        if inst.status is S.RAY_STOPPED and inst.cloud_instance_id in active_clouds:
            out.append(
                InstanceUpdate(
                    inst.instance_id,
                    S.TERMINATED,
                    details="stale row: its cloud instance runs a newer Ray node",
                )
            )
        elif inst.cloud_instance_id:
            out.append(
                InstanceUpdate(
                    inst.instance_id,
                    S.TERMINATING,
                    details=f"terminating after {inst.status.name}",
                    cloud_instance_id=inst.cloud_instance_id,
                )
            )
    return out


def launches(
    instances: Mapping[str, Instance], cfg: ReconcileConfig, new_request_id: NewId
) -> list[InstanceUpdate]:
    """Step 12: QUEUED -> REQUESTED at Ray's rate (§1.13)."""
    queued: dict[str, list[Instance]] = defaultdict(list)
    running: dict[str, int] = defaultdict(int)
    total_requested = 0
    for inst in instances.values():
        if inst.status is S.QUEUED:
            queued[inst.instance_type].append(inst)
        elif inst.status is S.REQUESTED:
            total_requested += 1
        elif inst.status is S.RAY_RUNNING:
            running[inst.instance_type] += 1
    if not queued:
        return []
    request_id = ""  # drawn only when a launch is requested (ids are not spent on no-ops)
    out = []
    for node_type, rows in queued.items():
        desired = max(1, math.ceil(cfg.upscaling_speed * max(running[node_type], 1)))
        n = min(cfg.max_concurrent_launches - total_requested, desired)
        n = max(0, min(n, len(rows)))
        rows.sort(key=lambda i: (_entered(i, S.QUEUED), i.instance_id))
        for inst in rows[:n]:
            if not inst.launch_request_id and not request_id:
                request_id = new_request_id()
            out.append(
                InstanceUpdate(
                    inst.instance_id,
                    S.REQUESTED,
                    details="launch requested",
                    launch_request_id=inst.launch_request_id or request_id,
                    instance_type=inst.instance_type,
                )
            )
        total_requested += n
    return out


def vc_held_nodes(state: autoscaler_pb2.ClusterResourceState) -> dict[str, str]:
    """Ray node (hex) -> the virtual cluster other than the primary that holds it."""
    held: dict[str, str] = {}
    for cluster_id, vc in state.virtual_cluster_states.items():
        if cluster_id == PRIMARY_CLUSTER_ID:
            continue
        for node_id in vc.nodes:
            held[node_id] = cluster_id
    return held


def hold_back_vc_nodes(
    reply: SchedulingReply, held: Mapping[str, str], scaled: frozenset[str] = frozenset()
) -> tuple[SchedulingReply, dict[str, list[str]]]:
    """No node a virtual cluster holds is terminated.  Idle ones are released to the primary
    instead (returned as cluster id -> nodes); a later round may then terminate them.  Nodes
    of the ``scaled`` clusters are left to the virtual-cluster policy (it keeps their min)."""
    keep, release = [], defaultdict(list)
    for term in reply.terminations:
        cluster = held.get(term.ray_node_id) if term.ray_node_id else None
        if cluster is None:
            keep.append(term)
        elif cluster in scaled:
            continue
        elif term.cause.value == "IDLE":
            release[cluster].append(term.ray_node_id)
    if len(keep) == len(reply.terminations):
        return reply, {}
    return replace(reply, terminations=tuple(keep)), dict(release)
