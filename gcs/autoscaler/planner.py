"""Planner: a ClusterResourceState (file or live GCS) + cluster config -> decisions.

Input conversion and output rendering only; the policy is ``scheduler.schedule``.

What a ClusterResourceState alone cannot tell, and what the planner assumes instead:

* every live Ray node is a RAY_RUNNING instance; pending launches are unknown (the
  instance manager holds them), so they are not counted;
* IPPR specs come from the cluster YAML (``ippr`` per node type, see ``config``);
* pod resize state (``ray.io/ippr-status`` and pod conditions) lives on the pods: pass it
  as ``ippr_statuses`` (keyed by pod name = ``instance_id``); a live node of an IPPR type
  without one is taken to be at rest at its Ray-reported CPU/memory, i.e. resizable;
* a placement group's strategy and state are read from the gang ``details``
  ("<pg hex>:<STRATEGY>|<STATE>"); nodes hosting its surviving bundles carry the
  ``_PG_<pg hex>`` dynamic label.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.scheduler import (
    ClusterConstraint,
    GangRequest,
    InstanceStatus,
    IpprStatus,
    LabelConstraint,
    LabelOp,
    NodeInstance,
    NodeKind,
    ResourceDemand,
    SchedulingInput,
    SchedulingReply,
    schedule,
)
from gcs.proto import autoscaler_pb2, common_pb2


class PlanInputError(ValueError):
    """The cluster state cannot be planned against; the message names the place."""


_LIVE = {autoscaler_pb2.RUNNING, autoscaler_pb2.IDLE}
_OPS = {common_pb2.LABEL_OPERATOR_IN: LabelOp.IN, common_pb2.LABEL_OPERATOR_NOT_IN: LabelOp.NOT_IN}


def load_state_json(path: str | Path) -> autoscaler_pb2.ClusterResourceState:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PlanInputError(f"{path}: cannot read ({exc.strerror})") from exc
    state = autoscaler_pb2.ClusterResourceState()
    try:
        json_format.Parse(text, state)
    except json_format.ParseError as exc:
        raise PlanInputError(f"{path}: not a ClusterResourceState in protobuf JSON: {exc}") from exc
    return state


def _resources(values: Mapping[str, float], where: str) -> dict[str, float]:
    out = {}
    for k, v in values.items():
        if v < 0 or math.isnan(v):
            raise PlanInputError(f"{where}.{k}: negative or invalid resource amount {v!r}")
        out[k] = float(v)
    return out


def _demand(req: autoscaler_pb2.ResourceRequest, count: int, where: str) -> ResourceDemand:
    selectors = []
    for i, sel in enumerate(req.label_selectors):
        constraints = []
        for j, c in enumerate(sel.label_constraints):
            op = _OPS.get(c.operator)
            if op is None:
                raise PlanInputError(f"{where}.label_selectors[{i}][{j}]: unsupported operator")
            constraints.append(LabelConstraint(c.label_key, op, tuple(c.label_values)))
        selectors.append(tuple(constraints))
    aff = anti = None
    for pc in req.placement_constraints:
        if pc.HasField("affinity"):
            aff = (pc.affinity.label_name, pc.affinity.label_value)
        if pc.HasField("anti_affinity"):
            anti = (pc.anti_affinity.label_name, pc.anti_affinity.label_value)
    res = _resources(req.resources_bundle, f"{where}.resources_bundle")
    return ResourceDemand(res, count, tuple(selectors), aff, anti)


def _bundles(reqs: Iterable[autoscaler_pb2.ResourceRequest], where: str) -> tuple:
    return tuple(_demand(r, 1, f"{where}[{i}]") for i, r in enumerate(reqs))


_STATUS_KEYS = {
    "desired-cpu": "desired_cpu",
    "desired-memory": "desired_memory",
    "resizing-at": "resizing_at",
    "k8s-resize-status": "k8s_resize_status",
    "suggested-max-cpu": "suggested_max_cpu",
    "suggested-max-memory": "suggested_max_memory",
    "last-failed-at": "last_failed_at",
    "last-failed-reason": "last_failed_reason",
}


def parse_ippr_statuses(raw: Any, where: str = "ippr statuses") -> dict[str, IpprStatus]:
    """``{pod: {current-cpu, current-memory, raylet-id?, resizing-at?, ...}}`` (§3.2 keys)."""
    if not isinstance(raw, Mapping):
        raise PlanInputError(f"{where}: expected a mapping of pod name to status")
    out = {}
    for pod, st in raw.items():
        here = f"{where}.{pod}"
        if not isinstance(st, Mapping):
            raise PlanInputError(f"{here}: expected a mapping")
        try:
            current = (float(st["current-cpu"]), float(st["current-memory"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanInputError(f"{here}: current-cpu and current-memory are required") from exc
        extra = {attr: st[key] for key, attr in _STATUS_KEYS.items() if st.get(key) is not None}
        out[str(pod)] = IpprStatus(*current, raylet_id=st.get("raylet-id") or "", **extra)
    return out


def _gang_meta(details: str) -> tuple[str, bool]:
    """GCS details "<pg hex>:<STRATEGY>|<STATE>" -> (strategy, is RESCHEDULING)."""
    _, _, rest = details.partition(":")
    strategy, _, pg_state = rest.partition("|")
    return strategy, pg_state == "RESCHEDULING"


def state_to_input(
    state: autoscaler_pb2.ClusterResourceState,
    cluster: ClusterConfig,
    now_s: float = 0.0,
    ippr_statuses: Mapping[str, IpprStatus] | None = None,
) -> SchedulingInput:
    """GCS view -> scheduler input. Every live Ray node is a RAY_RUNNING instance."""
    types = cluster.scheduler.node_types
    statuses = ippr_statuses or {}
    instances = []
    for i, ns in enumerate(state.node_states):
        where = f"node_states[{i}]"
        if ns.status not in _LIVE:
            continue
        if ns.ray_node_type_name not in types:
            raise PlanInputError(
                f"{where}.ray_node_type_name: unknown node type {ns.ray_node_type_name!r} "
                f"(cluster config has {', '.join(types)})"
            )
        node_hex = ns.node_id.hex()
        total = _resources(ns.total_resources, f"{where}.total_resources")
        ippr = None
        if types[ns.ray_node_type_name].ippr is not None:
            ippr = statuses.get(ns.instance_id) or IpprStatus(
                total.get("CPU", 0.0), total.get("memory", 0.0)
            )
        instances.append(
            NodeInstance(
                instance_id=ns.instance_id or node_hex,
                node_type=ns.ray_node_type_name,
                status=InstanceStatus.RAY_RUNNING,
                kind=NodeKind.HEAD
                if ns.ray_node_type_name == cluster.head_node_type
                else NodeKind.WORKER,
                ray_node_id=node_hex,
                total=total,
                available=_resources(ns.available_resources, f"{where}.available_resources"),
                labels={**ns.labels, **ns.dynamic_labels},
                idle_duration_ms=ns.idle_duration_ms,
                cloud_instance_id=ns.instance_id,
                ippr=ippr,
            )
        )
    demands = []
    for i, rc in enumerate(state.pending_resource_requests):
        if rc.count < 0:
            raise PlanInputError(f"pending_resource_requests[{i}].count: negative")
        demands.append(_demand(rc.request, rc.count, f"pending_resource_requests[{i}].request"))
    gangs = []
    for i, g in enumerate(state.pending_gang_resource_requests):
        where = f"pending_gang_resource_requests[{i}]"
        if g.bundle_selectors:
            options = [
                _bundles(bs.resource_requests, f"{where}.bundle_selectors[{j}].resource_requests")
                for j, bs in enumerate(g.bundle_selectors)
            ]
        else:
            options = [_bundles(g.requests, f"{where}.requests")]
        if not options[0]:
            continue  # GCS emits empty entries for placement groups not pending
        strategy, rescheduling = _gang_meta(g.details)
        gangs.append(GangRequest(options[0], g.details, tuple(options[1:]), strategy, rescheduling))
    constraints = []
    for i, c in enumerate(state.cluster_resource_constraints):
        where = f"cluster_resource_constraints[{i}].resource_requests"
        constraints.append(
            ClusterConstraint(
                tuple(
                    _demand(rc.request, rc.count, f"{where}[{j}].request")
                    for j, rc in enumerate(c.resource_requests)
                )
            )
        )
    return SchedulingInput(
        config=cluster.scheduler,
        instances=tuple(instances),
        demands=tuple(demands),
        gangs=tuple(gangs),
        constraints=tuple(constraints),
        now_s=now_s,
    )


def drop_unknown_node_types(
    state: autoscaler_pb2.ClusterResourceState, cluster: ClusterConfig
) -> tuple[autoscaler_pb2.ClusterResourceState, list[str]]:
    """Leave out live nodes whose type the cluster config lacks, with one warning each.

    A live GCS may run nodes the YAML does not describe (started by hand, another
    launcher); one such node must not stop the whole plan.  Their capacity is not counted,
    so the plan may launch more than a config that knew them would.
    """
    types = cluster.scheduler.node_types
    kept = autoscaler_pb2.ClusterResourceState()
    kept.CopyFrom(state)
    del kept.node_states[:]
    warnings = []
    for i, ns in enumerate(state.node_states):
        if ns.status in _LIVE and ns.ray_node_type_name not in types:
            warnings.append(
                f"node_states[{i}] (node {ns.node_id.hex()}): node type "
                f"{ns.ray_node_type_name!r} is not in the cluster config "
                f"({', '.join(types)}); left out of the plan, its capacity not counted"
            )
            continue
        kept.node_states.append(ns)
    return kept, warnings


def plan(
    state: autoscaler_pb2.ClusterResourceState,
    cluster: ClusterConfig,
    now_s: float = 0.0,
    ippr_statuses: Mapping[str, IpprStatus] | None = None,
) -> SchedulingReply:
    return schedule(state_to_input(state, cluster, now_s, ippr_statuses))


def _demand_json(d: ResourceDemand) -> dict[str, Any]:
    out: dict[str, Any] = {"resources": dict(d.resources), "count": d.count}
    if d.selectors:
        out["label_selectors"] = [
            [[c.key, c.op.value, list(c.values)] for c in sel] for sel in d.selectors
        ]
    if d.affinity:
        out["affinity"] = list(d.affinity)
    if d.anti_affinity:
        out["anti_affinity"] = list(d.anti_affinity)
    return out


def reply_to_json(reply: SchedulingReply) -> dict[str, Any]:
    return {
        "launch": dict(reply.launches),
        "terminate": [
            {
                "node_id": t.ray_node_id,
                "instance_id": t.instance_id,
                "node_type": t.node_type,
                "cause": t.cause.value,
                "reason": t.reason,
            }
            for t in reply.terminations
        ],
        "infeasible": {
            "requests": [_demand_json(d) for d in reply.infeasible_demands],
            "gangs": [
                {"details": g.details, "bundles": [_demand_json(b) for b in g.bundles]}
                for g in reply.infeasible_gangs
            ],
            "constraints": [
                {"bundles": [_demand_json(b) for b in c.bundles]}
                for c in reply.infeasible_constraints
            ],
        },
        "resize": [
            {
                "node_id": r.ray_node_id,
                "instance_id": r.instance_id,
                "cloud_instance_id": r.cloud_instance_id,
                "node_type": r.node_type,
                "cpu": r.cpu,
                "memory": int(r.memory) if r.memory == int(r.memory) else r.memory,
                "current_cpu": r.current_cpu,
                "current_memory": int(r.current_memory)
                if r.current_memory == int(r.current_memory)
                else r.current_memory,
                "reason": r.reason,
            }
            for r in reply.resizes
        ],
        "reasons": [_reason_line(r) for r in reply.reasons],
        "scores": {_reason_line(r): r.detail for r in reply.reasons if r.detail},
    }


def _reason_line(r: Any) -> str:
    return r.reason if r.reason.startswith(r.action) else f"{r.action} {r.subject}: {r.reason}"


def _selectors_text(row: dict[str, Any]) -> str:
    selectors = row.get("label_selectors") or []
    parts = [
        " && ".join(f"{key} {op} ({','.join(values)})" for key, op, values in sel)
        for sel in selectors
        if sel
    ]
    return f" [{' | '.join(parts)}]" if parts else ""


def render_table(doc: dict[str, Any], *, verbose: bool = False) -> str:
    """The plan for people; ``verbose`` adds the raw scores behind each launch."""
    lines = []
    if doc.get("warnings"):
        lines.append("WARNINGS")
        lines += [f"  ! {w}" for w in doc["warnings"]]
    lines.append("LAUNCH")
    lines += [f"  {t:<24} {n:>6}" for t, n in doc["launch"].items()] or ["  (none)"]
    lines.append("TERMINATE")
    lines += [
        f"  {t['instance_id']:<24} {t['node_type']:<16} {t['cause']:<22} {t['reason']}"
        for t in doc["terminate"]
    ] or ["  (none)"]
    lines.append("RESIZE")
    lines += [
        f"  {r['instance_id']:<24} {r['node_type']:<16} CPU {r['current_cpu']:g} -> "
        f"{r['cpu']:g}, memory {r['current_memory']:g} -> {r['memory']:g}  {r['reason']}"
        for r in doc.get("resize", [])
    ] or ["  (none)"]
    inf = doc["infeasible"]
    lines.append("INFEASIBLE")
    rows = [
        f"  {r['count']:>6} x {json.dumps(r['resources'], sort_keys=True)}{_selectors_text(r)}"
        for r in inf["requests"]
    ]
    rows += [f"  gang {g['details'] or '(no details)'}" for g in inf["gangs"]]
    rows += ["  request_resources constraint" for _ in inf["constraints"]]
    lines += rows or ["  (none)"]
    lines.append("REASONS")
    scores = doc.get("scores", {}) if verbose else {}
    for r in doc["reasons"]:
        lines.append(f"  - {r}")
        if r in scores:
            lines.append(f"      scores: {scores[r]}")
    if not doc["reasons"]:
        lines.append("  (none)")
    return "\n".join(lines)


async def fetch_state(address: str, timeout_s: float = 10.0) -> autoscaler_pb2.ClusterResourceState:
    """GetClusterId, then GetClusterResourceState with the cluster id metadata Ray expects."""
    from gcs.proto import gcs_service_pb2
    from gcs.rpc import ServiceStub
    from gcs.rpc.security import Security
    from gcs.rpc.services import AUTOSCALER_STATE, NODE_INFO

    async with Security.from_env().aio_channel(address) as channel:
        node_info = ServiceStub(channel, NODE_INFO, timeout_s=timeout_s)
        cid = await node_info.GetClusterId(gcs_service_pb2.GetClusterIdRequest())
        stub = ServiceStub(
            channel,
            AUTOSCALER_STATE,
            metadata=[("ray_cluster_id", cid.cluster_id.hex())],
            timeout_s=timeout_s,
        )
        reply = await stub.GetClusterResourceState(autoscaler_pb2.GetClusterResourceStateRequest())
        return reply.cluster_resource_state
