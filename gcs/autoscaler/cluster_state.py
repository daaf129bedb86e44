"""A GCS ClusterResourceState + cluster config -> the scheduler's input (pure).

What a ClusterResourceState alone cannot tell, and what is assumed instead:

* every live Ray node is a RAY_RUNNING instance; pending launches are unknown (the
  instance manager holds them), so they are not counted;
* IPPR specs come from the cluster config (``ippr`` per node type, see ``config``);
* pod resize state (``ray.io/ippr-status`` and pod conditions) lives on the pods: pass it
  as ``ippr_statuses`` (keyed by pod name = ``instance_id``); a live node of an IPPR type
  without one is taken to be at rest at its Ray-reported CPU/memory, i.e. resizable;
* a placement group's strategy and state are read from the gang ``details``
  ("<pg hex>:<STRATEGY>|<STATE>"); nodes hosting its surviving bundles carry the
  ``_PG_<pg hex>`` dynamic label.

Used by the reconciler (demand of each round) and by the planner (``gcs autoscaler plan``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from gcs.autoscaler.config import ClusterConfig
from gcs.policy.autoscaling.model import InstanceStatus, NodeKind
from gcs.policy.autoscaling.scheduler.types import (
    ClusterConstraint,
    GangRequest,
    IpprStatus,
    LabelConstraint,
    LabelOp,
    NodeInstance,
    ResourceDemand,
    SchedulingInput,
)
from gcs.proto import autoscaler_pb2, common_pb2

__all__ = ["LIVE_NODE_STATUSES", "PlanInputError", "state_to_input"]


class PlanInputError(ValueError):
    """The cluster state cannot be planned against; the message names the place."""


LIVE_NODE_STATUSES = {autoscaler_pb2.RUNNING, autoscaler_pb2.IDLE}
_OPS = {common_pb2.LABEL_OPERATOR_IN: LabelOp.IN, common_pb2.LABEL_OPERATOR_NOT_IN: LabelOp.NOT_IN}


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
        if ns.status not in LIVE_NODE_STATUSES:
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
