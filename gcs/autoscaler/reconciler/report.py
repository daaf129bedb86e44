"""Step 14: the AutoscalingState reported to the GCS after every round."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from gcs.autoscaler.instances.model import Instance
from gcs.policy.autoscaling.model import InstanceStatus
from gcs.policy.autoscaling.scheduler.types import (
    ClusterConstraint,
    GangRequest,
    LabelOp,
    ResourceDemand,
    SchedulingReply,
)
from gcs.proto import autoscaler_pb2, common_pb2

MAX_INFEASIBLE_REQUESTS = 10_000
"""Ray lists one entry per unit request; past this many we stop listing (and log)."""

_OPS = {
    LabelOp.IN: common_pb2.LABEL_OPERATOR_IN,
    LabelOp.NOT_IN: common_pb2.LABEL_OPERATOR_NOT_IN,
}


def _secs(ns: int | None) -> int:
    return int((ns or 0) // 1_000_000_000)


def resource_request(d: ResourceDemand) -> autoscaler_pb2.ResourceRequest:
    req = autoscaler_pb2.ResourceRequest(resources_bundle=dict(d.resources))
    for sel in d.selectors:
        out = req.label_selectors.add()
        for c in sel:
            if c.op in _OPS:
                out.label_constraints.add(
                    label_key=c.key, operator=_OPS[c.op], label_values=list(c.values)
                )
    if d.affinity:
        pc = req.placement_constraints.add()
        pc.affinity.label_name, pc.affinity.label_value = d.affinity
    if d.anti_affinity:
        pc = req.placement_constraints.add()
        pc.anti_affinity.label_name, pc.anti_affinity.label_value = d.anti_affinity
    return req


def autoscaling_state(
    instances: Mapping[str, Instance],
    reply: SchedulingReply | None,
    *,
    im_version: int,
    cluster_state: autoscaler_pb2.ClusterResourceState,
) -> autoscaler_pb2.AutoscalingState:
    out = autoscaler_pb2.AutoscalingState(
        autoscaler_state_version=im_version,
        last_seen_cluster_resource_state_version=cluster_state.cluster_resource_state_version,
    )
    pending: dict[tuple[str, str], list[Instance]] = defaultdict(list)
    for inst in instances.values():
        if inst.status in (InstanceStatus.REQUESTED, InstanceStatus.QUEUED):
            if inst.launch_request_id:
                pending[(inst.launch_request_id, inst.instance_type)].append(inst)
        elif inst.status in (InstanceStatus.ALLOCATED, InstanceStatus.RAY_INSTALLING):
            out.pending_instances.add(
                instance_type_name=inst.instance_type,
                ray_node_type_name=inst.instance_type,
                instance_id=inst.instance_id,
                details=_pending_details(inst),
            )
        elif inst.status is InstanceStatus.ALLOCATION_FAILED:
            out.failed_instance_requests.add(
                instance_type_name=inst.instance_type,
                ray_node_type_name=inst.instance_type,
                count=1,
                reason=inst.latest_details(),
                start_ts=_secs(inst.entered_at_ns(InstanceStatus.REQUESTED)),
                failed_ts=_secs(inst.entered_at_ns()),
            )
    for (_, node_type), rows in pending.items():
        out.pending_instance_requests.add(
            instance_type_name=node_type,
            ray_node_type_name=node_type,
            count=len(rows),
            request_ts=max(_secs(i.entered_at_ns(InstanceStatus.REQUESTED)) for i in rows),
        )
    if reply is not None:
        _infeasible(out, reply, cluster_state)
    return out


def _pending_details(inst: Instance) -> str:
    """What a pending node waits for, as ``gcs status`` / ``ray status`` print it."""
    where = f"cloud instance {inst.cloud_instance_id}" if inst.cloud_instance_id else "its host"
    if inst.status is InstanceStatus.RAY_INSTALLING:
        return f"installing Ray on {where}"
    return f"waiting for Ray to start on {where}"


def _infeasible(
    out: autoscaler_pb2.AutoscalingState,
    reply: SchedulingReply,
    cluster_state: autoscaler_pb2.ClusterResourceState,
) -> None:
    listed = 0
    for d in reply.infeasible_demands:
        req = resource_request(d)
        for _ in range(min(d.count, MAX_INFEASIBLE_REQUESTS - listed)):
            out.infeasible_resource_requests.append(req)
        listed += d.count
    gangs_by_details = {g.details: g for g in cluster_state.pending_gang_resource_requests}
    for gang in reply.infeasible_gangs:
        original = gangs_by_details.get(gang.details)
        if original is not None:
            out.infeasible_gang_resource_requests.append(original)
        else:
            out.infeasible_gang_resource_requests.append(_gang(gang))
    for c in reply.infeasible_constraints:
        out.infeasible_cluster_resource_constraints.append(_constraint(c))


def _gang(gang: GangRequest) -> autoscaler_pb2.GangResourceRequest:
    g = autoscaler_pb2.GangResourceRequest(details=gang.details)
    for b in gang.bundles:
        for _ in range(b.count):
            g.requests.append(resource_request(b))
    return g


def _constraint(c: ClusterConstraint) -> autoscaler_pb2.ClusterResourceConstraint:
    out = autoscaler_pb2.ClusterResourceConstraint()
    for b in c.bundles:
        out.resource_requests.add(request=resource_request(b), count=b.count)
    return out
