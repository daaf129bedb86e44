"""Reference scenario JSON (autoscaler-v2.md §6) -> scheduler input; reply -> comparable form."""

from __future__ import annotations

from typing import Any

from gcs.policy.autoscaling.model import InstanceStatus, NodeKind
from gcs.policy.autoscaling.scheduler import (
    ClusterConstraint,
    GangRequest,
    IpprSpec,
    IpprStatus,
    LabelConstraint,
    LabelOp,
    NodeInstance,
    NodeTypeConfig,
    Options,
    ResourceDemand,
    SchedulerConfig,
    SchedulingInput,
    SchedulingReply,
)


def _selectors(raw: list) -> tuple:
    return tuple(
        tuple(LabelConstraint(k, LabelOp(op), tuple(vals)) for k, op, vals in sel)
        for sel in raw or ()
    )


def _demand(raw: dict[str, Any], constraint: tuple[str, str, str] | None = None) -> ResourceDemand:
    aff = anti = None
    for kind, key, value in raw.get("constraints", []):
        if kind == "affinity":
            aff = (key, value)
        else:
            anti = (key, value)
    if constraint is not None:
        kind, key, value = constraint
        if kind == "affinity":
            aff = (key, value)
        else:
            anti = (key, value)
    return ResourceDemand(
        {k: float(v) for k, v in raw["resources"].items()},
        int(raw.get("count", 1)),
        _selectors(raw.get("label_selectors", [])),
        aff,
        anti,
    )


def _gang(raw: dict[str, Any]) -> GangRequest:
    strategy = raw.get("strategy")
    extra = None
    if strategy == "STRICT_SPREAD":
        extra = ("anti_affinity", f"_PG_{raw['pg_id']}", "")
    elif strategy == "STRICT_PACK":
        extra = ("affinity", f"_PG_{raw['pg_id']}", "")
    bundles = tuple(_demand(r, extra) for r in raw["requests"])
    fallbacks = tuple(tuple(_demand(r, extra) for r in fb) for fb in raw.get("fallback", []))
    return GangRequest(bundles, raw.get("details", ""), fallbacks)


def _ippr_spec(raw: dict[str, Any] | None) -> IpprSpec | None:
    if raw is None:
        return None
    return IpprSpec(
        max_cpu=float(raw["max_cpu"]),
        max_memory=float(raw["max_memory"]),
        min_cpu=float(raw.get("min_cpu", 0)),
        min_memory=float(raw.get("min_memory", 0)),
        resize_timeout_s=int(raw.get("resize_timeout", 0)),
    )


def _ippr_status(raw: dict[str, Any] | None) -> IpprStatus | None:
    if raw is None:
        return None
    fields = ("desired_cpu", "desired_memory", "resizing_at", "k8s_resize_status")
    fields += ("suggested_max_cpu", "suggested_max_memory", "last_failed_at")
    fields += ("last_failed_reason",)
    return IpprStatus(
        current_cpu=float(raw["current_cpu"]),
        current_memory=float(raw["current_memory"]),
        raylet_id=raw.get("raylet_id") or "",
        **{f: raw[f] for f in fields if raw.get(f) is not None},
    )


def scenario_input(inp: dict[str, Any], options: Options | None = None) -> SchedulingInput:
    ippr_groups = inp.get("ippr", {}).get("groups", {})
    ippr_statuses = inp.get("ippr", {}).get("statuses", {})
    types = {
        name: NodeTypeConfig(
            name=name,
            resources={k: float(v) for k, v in t.get("resources", {}).items()},
            min_workers=t.get("min_workers", 0),
            max_workers=t.get("max_workers", 0),
            labels=t.get("labels", {}),
            priority=t.get("priority", 0),
            idle_timeout_s=t.get("idle_timeout_s"),
            launch_config_hash=t.get("launch_config_hash", ""),
            ippr=_ippr_spec(ippr_groups.get(name)),
        )
        for name, t in inp["node_types"].items()
    }
    instances = []
    for raw in inp.get("existing_nodes", []):
        ids = (
            [raw["id"]] if "count" not in raw else [f"{raw['id']}-{i}" for i in range(raw["count"])]
        )
        for iid in ids:
            status = InstanceStatus[raw.get("status", "RAY_RUNNING")]
            running = status is InstanceStatus.RAY_RUNNING
            cfg_res = inp["node_types"].get(raw["node_type"], {}).get("resources", {})
            total = raw.get("total", cfg_res)
            labels = {**raw.get("labels", {}), **raw.get("dynamic_labels", {})}
            instances.append(
                NodeInstance(
                    instance_id=iid,
                    node_type=raw["node_type"],
                    status=status,
                    kind=NodeKind(raw.get("node_kind", "WORKER")),
                    ray_node_id=raw.get("ray_node_id", f"r-{iid}") if running else "",
                    total=total,
                    available=raw.get("available", total),
                    labels=labels,
                    idle_duration_ms=raw.get("idle_duration_ms", 0),
                    launch_config_hash=raw.get("launch_config_hash", ""),
                    cloud_instance_id=raw.get("cloud_instance_id", ""),
                    ippr=_ippr_status(ippr_statuses.get(raw.get("cloud_instance_id", ""))),
                )
            )
    constraints = ()
    if inp.get("cluster_resource_constraints"):
        constraints = (
            ClusterConstraint(tuple(_demand(r) for r in inp["cluster_resource_constraints"])),
        )
    return SchedulingInput(
        config=SchedulerConfig(
            node_types=types,
            max_num_nodes=inp.get("max_num_nodes"),
            idle_timeout_s=inp.get("idle_timeout_s"),
            pending_idle_timeout_s=inp.get("pending_idle_timeout_s"),
            disable_launch_config_check=inp.get("disable_launch_config_check", False),
            options=options or Options(),
        ),
        instances=tuple(instances),
        demands=tuple(_demand(r) for r in inp.get("resource_requests", [])),
        gangs=tuple(_gang(g) for g in inp.get("gang_requests", [])),
        constraints=constraints,
        cloud_availability=inp.get("cloud_resource_availabilities", {}),
        recoverable_availability=inp.get("recoverable_resource_availabilities", {}),
    )


def _shape(resources: dict) -> tuple:
    return tuple(sorted((k, float(v)) for k, v in resources.items()))


def ray_decisions(out: dict[str, Any]) -> dict[str, Any]:
    infeasible: dict[tuple, int] = {}
    for r in out["infeasible_resource_requests"]:
        key = _shape(r["resources"])
        infeasible[key] = infeasible.get(key, 0) + r.get("count", 1)
    return {
        "launch": {k: v for k, v in out["to_launch"].items() if v},
        "terminate": sorted((t["instance_id"], t["cause"]) for t in out["to_terminate"]),
        "infeasible": infeasible,
        "infeasible_gangs": len(out["infeasible_gang_resource_requests"]),
        "infeasible_constraints": len(out["infeasible_cluster_resource_constraints"]),
        "resize": sorted(
            (r["cloud_instance_id"], float(r["desired_cpu"]), float(r["desired_memory"]))
            for r in out.get("to_ippr", [])
        ),
        "cluster_resources": {k: float(v) for k, v in out["cluster_resources"].items() if v},
    }


def our_decisions(reply: SchedulingReply) -> dict[str, Any]:
    infeasible: dict[tuple, int] = {}
    for d in reply.infeasible_demands:
        key = _shape(d.resources)
        infeasible[key] = infeasible.get(key, 0) + d.count
    return {
        "launch": dict(reply.launches),
        "terminate": sorted((t.instance_id, t.cause.value) for t in reply.terminations),
        "infeasible": infeasible,
        "infeasible_gangs": len(reply.infeasible_gangs),
        "infeasible_constraints": len(reply.infeasible_constraints),
        "resize": sorted((r.cloud_instance_id, r.cpu, r.memory) for r in reply.resizes),
        "cluster_resources": {k: v for k, v in reply.cluster_resources.items() if v},
    }
