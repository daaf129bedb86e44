"""Planner: a ClusterResourceState (file or live GCS) + cluster config -> decisions.

Input reading and output rendering for ``gcs autoscaler plan``; the conversion to the
scheduler's input is :mod:`gcs.autoscaler.cluster_state` (its assumptions are listed
there) and the policy is ``scheduler.schedule``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from gcs.autoscaler.cluster_state import LIVE_NODE_STATUSES, PlanInputError, state_to_input
from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.reconciler.observed import ray_nodes_from_state
from gcs.autoscaler.reconciler.vc_scaling import (
    hide_held_capacity,
    plan_virtual_clusters,
    primary_demand,
    waiting_demand,
)
from gcs.policy.autoscaling.scheduler import IpprStatus, ResourceDemand, SchedulingReply, schedule
from gcs.proto import autoscaler_pb2

__all__ = [
    "PlanInputError",
    "drop_unknown_node_types",
    "fetch_state",
    "load_state_json",
    "parse_ippr_statuses",
    "plan",
    "render_table",
    "reply_to_json",
    "state_to_input",
]


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
        if ns.status in LIVE_NODE_STATUSES and ns.ray_node_type_name not in types:
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
    """What a reconcile round would decide for ``state``, as the reconciler composes it:
    each indivisible virtual cluster's demand is planned on its own, the rest by the
    cluster's scheduler, and ``waiting`` says why each piece of demand waits (the one
    verdict ``gcs status`` and ``gcs submit`` read)."""
    vc = plan_virtual_clusters(state, {}, ray_nodes_from_state(state), cluster, now_s, schedule)
    inp = state_to_input(primary_demand(state, vc.planned), cluster, now_s, ippr_statuses)
    reply = schedule(hide_held_capacity(inp, vc.held))
    return replace(reply, waiting=waiting_demand(reply, vc))


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
        "waiting": [w.to_json() for w in reply.waiting],
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
    lines = ["LAUNCH"]  # warnings are the caller's to print, once (on stderr)
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
    lines.append("INFEASIBLE (Ray's list: not placed this round, a node-type limit included)")
    rows = [
        f"  {r['count']:>6} x {json.dumps(r['resources'], sort_keys=True)}{_selectors_text(r)}"
        for r in inf["requests"]
    ]
    rows += [f"  gang {g['details'] or '(no details)'}" for g in inf["gangs"]]
    rows += ["  request_resources constraint" for _ in inf["constraints"]]
    lines += rows or ["  (none)"]
    lines.append("WAITING (why: infeasible = no node type fits; capped = a limit stops the launch)")
    lines += [
        f"  {w['count']:>6} x {json.dumps(w['resources'], sort_keys=True)}{_selectors_text(w)}"
        + f" {w['reason']}"
        + (f" [virtual cluster {w['virtual_cluster']}]" if w.get("virtual_cluster") else "")
        + f": {w['why']}"
        for w in doc.get("waiting", [])
    ] or ["  (none)"]
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
    from gcs.rpc.descriptors import AUTOSCALER_STATE, NODE_INFO
    from gcs.rpc.security import Security

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
