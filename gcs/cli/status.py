"""A ``ray status``-like text view of ``GetClusterStatus`` (pure: proto in, text out).

Sections and wording follow Ray 2.60's ``ray status`` (``format_info_string``): memory in
Ray's units (``0B/15.15GiB memory``), a pending node as ``IP: type, what it waits for``,
launch failures per node type as ``type: LaunchFailed (latest_attempt: HH:MM:SS)`` followed,
beyond Ray, by the reason (Ray shows it only with ``-v``).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from gcs.base.units import format_shape, usage_line
from gcs.policy.autoscaling.scheduler.waiting import WaitingDemand, WaitKind, WaitReason
from gcs.proto import autoscaler_pb2, common_pb2

NodeStatus = autoscaler_pb2.NodeStatus
_RULE = "-" * 64
MAX_FAILURES_SHOWN = 20
"""Ray's AUTOSCALER_MAX_FAILURES_DISPLAYED."""


def _fmt_shape(shape: dict[str, float]) -> str:
    return format_shape(shape)


def _clock(ts_s: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts_s))


def _fmt_selectors(selectors: list[common_pb2.LabelSelector]) -> str:
    parts = []
    for selector in selectors:
        for c in selector.label_constraints:
            op = "in" if c.operator == common_pb2.LABEL_OPERATOR_IN else "!in"
            parts.append(f"{c.label_key} {op} ({','.join(c.label_values)})")
    return f" [{'; '.join(parts)}]" if parts else ""


def render(
    reply: autoscaler_pb2.GetClusterStatusReply,
    *,
    now_s: float | None = None,
    waiting: tuple[WaitingDemand, ...] | None = None,
) -> str:
    """``waiting``: the autoscaler's verdicts on waiting demand (None: no autoscaler of ours
    published any, so only Ray's undivided list can be shown)."""
    state = reply.cluster_resource_state
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now_s or time.time()))
    lines = [f"======== Cluster status: {stamp} ========", "Node status", _RULE]
    by_status: dict[int, Counter[str]] = defaultdict(Counter)
    dead: list[autoscaler_pb2.NodeState] = []
    used: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for node in state.node_states:
        if node.status == NodeStatus.DEAD:
            dead.append(node)
            continue
        by_status[node.status][node.ray_node_type_name or "(no type)"] += 1
        for name, amount in node.total_resources.items():
            total[name] += amount
            used[name] += amount - node.available_resources.get(name, 0.0)
    for title, status in (
        ("Active", NodeStatus.RUNNING),
        ("Idle", NodeStatus.IDLE),
        ("Draining", NodeStatus.DRAINING),
    ):
        lines.append(f"{title}:")
        counts = by_status.get(status)
        if not counts:
            lines.append(" (no nodes)")
        for node_type, count in sorted(counts.items()) if counts else ():
            lines.append(f" {count} {node_type}")
    lines.append("Pending:")
    lines += _pending_lines(reply.autoscaling_state) or [" (no pending nodes)"]
    lines.append("Recent failures:")
    failures = _failure_lines(dead, reply.autoscaling_state)
    lines += failures[-MAX_FAILURES_SHOWN:] or [" (no failures)"]
    lines += ["", "Resources", _RULE, "Usage:"]
    if not total:
        lines.append(" (no resources)")
    for name in sorted(total):
        if name.startswith("node:"):
            continue
        lines.append(f" {usage_line(name, used[name], total[name])}")
    lines.append("Constraints:")
    constraints = [c for c in state.cluster_resource_constraints if c.resource_requests]
    if not constraints:
        lines.append(" (no request_resources() constraints)")
    for constraint in constraints:
        for by_count in constraint.resource_requests:
            shape = dict(by_count.request.resources_bundle)
            lines.append(
                f" {_fmt_shape(shape)}{_fmt_selectors(list(by_count.request.label_selectors))}"
                f": {by_count.count} from request_resources()"
            )
    lines.append("Demands:")
    if not state.pending_resource_requests and not state.pending_gang_resource_requests:
        lines.append(" (no resource demands)")
    for by_count in state.pending_resource_requests:
        shape = dict(by_count.request.resources_bundle)
        lines.append(
            f" {_fmt_shape(shape)}{_fmt_selectors(list(by_count.request.label_selectors))}"
            f": {by_count.count}+ pending tasks/actors"
        )
    for gang in state.pending_gang_resource_requests:
        shapes = Counter(_fmt_shape(dict(r.resources_bundle)) for r in gang.requests)
        strategy = gang.details.split(":", 1)[-1].split("|", 1)[0] if gang.details else "?"
        body = ", ".join(f"{s} * {n}" for s, n in shapes.items())
        lines.append(f" {body} ({strategy}): 1+ pending placement groups")
    if waiting is None:
        lines += _infeasible_lines(reply.autoscaling_state)
    else:
        lines += waiting_lines(waiting)
    return "\n".join(lines) + "\n"


_SECTIONS = (
    (
        WaitReason.INFEASIBLE,
        "Infeasible (no node type fits; they wait until the cluster config changes):",
    ),
    (
        WaitReason.CAPPED,
        "Capped (a node type fits but a limit stops the launch; they run when capacity frees):",
    ),
    (WaitReason.PENDING_CAPACITY, "Waiting for nodes being added:"),
)


def waiting_lines(waiting: tuple[WaitingDemand, ...]) -> list[str]:
    """The autoscaler's verdicts, one section per reason, each line with its virtual
    cluster (if any) and why."""
    lines: list[str] = []
    for reason, title in _SECTIONS:
        rows = [w for w in waiting if w.reason is reason]
        if not rows:
            continue
        lines.append(title)
        for w in rows:
            where = f" [virtual cluster {w.cluster_id}]" if w.cluster_id else ""
            what = {
                WaitKind.TASKS: f"{w.count} pending tasks/actors",
                WaitKind.PLACEMENT_GROUP: f"placement group {w.details or ''}".rstrip(),
                WaitKind.CONSTRAINT: "request_resources() constraint",
            }[w.kind]
            shape = _fmt_shape(dict(w.resources)) + _fmt_wait_selectors(w)
            lines.append(f" {shape}: {what}{where} - {w.why}")
    return lines


_OPS = {"in": "in", "not_in": "!in", "exists": "exists", "does_not_exist": "!exists"}


def _fmt_wait_selectors(w: WaitingDemand) -> str:
    parts = [
        " && ".join(
            f"{c.key} {_OPS[c.op.value]}" + (f" ({','.join(c.values)})" if c.values else "")
            for c in sel
        )
        for sel in w.selectors
        if sel
    ]
    return f" [{' | '.join(parts)}]" if parts else ""


def _pending_lines(scaling: autoscaler_pb2.AutoscalingState) -> list[str]:
    """Launches not yet answered by the cloud, then instances waiting for Ray."""
    lines = [
        f" {request.ray_node_type_name}, {request.count} launching"
        for request in scaling.pending_instance_requests
    ]
    for instance in scaling.pending_instances:
        what = instance.details or "starting"
        if instance.ip_address:  # Ray's form
            lines.append(f" {instance.ip_address}: {instance.ray_node_type_name}, {what}")
        else:
            lines.append(f" {instance.ray_node_type_name} (no IP yet): {what}")
    return lines


def _failure_lines(
    dead: list[autoscaler_pb2.NodeState], scaling: autoscaler_pb2.AutoscalingState
) -> list[str]:
    """Dead nodes (Ray's NodeTerminated), then failed launches: one line per node type,
    its latest attempt, how many failed, and why."""
    lines = [
        f" {node.ray_node_type_name or 'node'}: NodeTerminated "
        f"(ip: {node.node_ip_address}, id: {node.node_id.hex()[:12]})"
        for node in dead[-MAX_FAILURES_SHOWN:]
    ]
    latest: dict[str, autoscaler_pb2.FailedInstanceRequest] = {}
    counts: Counter[str] = Counter()
    for failed in scaling.failed_instance_requests:
        name = failed.ray_node_type_name or failed.instance_type_name
        counts[name] += failed.count or 1
        if name not in latest or failed.failed_ts >= latest[name].failed_ts:
            latest[name] = failed
    for name, failed in sorted(latest.items(), key=lambda kv: kv[1].failed_ts):
        times = f", {counts[name]} failed" if counts[name] > 1 else ""
        why = f" - {failed.reason}" if failed.reason else ""
        lines.append(
            f" {name}: LaunchFailed (latest_attempt: {_clock(failed.failed_ts)}{times}){why}"
        )
    return lines


def _infeasible_lines(scaling: autoscaler_pb2.AutoscalingState) -> list[str]:
    """Ray's infeasible lists, grouped by shape: what the autoscaler could not place, a
    node-type limit included (Ray's meaning), when no verdict tells the two apart."""
    shapes: Counter[str] = Counter()
    for request in scaling.infeasible_resource_requests:
        shapes[_fmt_shape(dict(request.resources_bundle))] += 1
    gangs = len(scaling.infeasible_gang_resource_requests)
    constraints = len(scaling.infeasible_cluster_resource_constraints)
    if not shapes and not gangs and not constraints:
        return []
    lines = ["Not placeable by the autoscaler (no node type fits, or a limit is reached):"]
    lines += [f" {shape}: {n} pending tasks/actors" for shape, n in shapes.items()]
    if gangs:
        lines.append(f" {gangs} placement groups")
    if constraints:
        lines.append(f" {constraints} request_resources() constraints")
    return lines


def render_nodes(reply: autoscaler_pb2.GetClusterStatusReply) -> str:
    """``ray status -v``'s per-node part: every node with its usage, idle time and labels."""
    lines = ["", "Node details", _RULE]
    nodes = sorted(
        reply.cluster_resource_state.node_states,
        key=lambda n: (n.status == NodeStatus.DEAD, n.ray_node_type_name, n.node_id),
    )
    if not nodes:
        lines.append(" (no nodes)")
    for node in nodes:
        status = NodeStatus.Name(node.status)
        idle = f", idle {node.idle_duration_ms / 1000:.0f} s" if node.idle_duration_ms else ""
        lines.append(
            f"Node {node.node_id.hex()} ({node.ray_node_type_name or 'no type'}, "
            f"{node.node_ip_address or '?'}): {status}{idle}"
        )
        for name in sorted(node.total_resources):
            if name.startswith("node:"):
                continue
            total = node.total_resources[name]
            used = total - node.available_resources.get(name, 0.0)
            lines.append(f"  {usage_line(name, used, total)}")
        labels = {k: v for k, v in node.labels.items() if not k.startswith("ray.io/")}
        if labels:
            lines.append("  labels: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return "\n".join(lines) + "\n"


def render_virtual_clusters(rows: list[tuple[str, bool, int, dict[str, int]]]) -> str:
    """(id, divisible, nodes, replica sets) per virtual cluster."""
    lines = ["", "Virtual clusters", _RULE]
    if not rows:
        lines.append(" (none)")
    for cluster_id, divisible, nodes, replica_sets in rows:
        kind = "divisible" if divisible else "indivisible"
        sets = ", ".join(f"{t}: {n}" for t, n in sorted(replica_sets.items())) or "-"
        lines.append(f" {cluster_id} ({kind}): {nodes} nodes [{sets}]")
    return "\n".join(lines) + "\n"


def render_events(events: list[dict[str, object]], *, limit: int = 20) -> str:
    """The autoscaler's recent events, as ``ray status`` ends with its own."""
    if not events:
        return ""
    lines = ["Recent autoscaler events:"]
    for event in events[-limit:]:
        when = _clock(float(event.get("t", 0.0)))  # type: ignore[arg-type]
        lines.append(f" {when} {event.get('message', '')}")
    return "\n".join(lines) + "\n"
