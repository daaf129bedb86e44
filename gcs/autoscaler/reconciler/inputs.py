"""Scheduler input for one round: the instance manager's instances joined with the Ray
nodes the GCS reports, plus the demand of the same ClusterResourceState."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gcs.autoscaler.cluster_state import state_to_input
from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.instances.model import Instance
from gcs.autoscaler.instances.transitions import is_ray_running_reachable
from gcs.policy.autoscaling.model import InstanceStatus, NodeKind, RayNode, RayNodeStatus
from gcs.policy.autoscaling.scheduler.types import IpprStatus, NodeInstance, SchedulingInput
from gcs.proto import autoscaler_pb2

_LIVE = (RayNodeStatus.RUNNING, RayNodeStatus.IDLE)
Memo = dict[str, tuple[Instance, RayNode | None, NodeInstance]]


def scheduling_input(
    state: autoscaler_pb2.ClusterResourceState,
    instances: Mapping[str, Instance],
    ray_nodes: Sequence[RayNode],
    cluster: ClusterConfig,
    now_s: float,
    memo: Memo | None = None,
    ippr: Mapping[str, IpprStatus] | None = None,
) -> SchedulingInput:
    """``memo`` (kept by the caller between rounds) hands back last round's NodeInstance
    for an instance whose Instance and RayNode objects are the very same ones and whose
    resize state (``ippr``: per cloud instance id, KubeRay pods of IPPR groups) is equal;
    it is refilled with this round's."""
    last = memo.copy() if memo is not None else {}
    if memo is not None:
        memo.clear()
    ippr = ippr or {}
    demand_only = autoscaler_pb2.ClusterResourceState(
        pending_resource_requests=state.pending_resource_requests,
        pending_gang_resource_requests=state.pending_gang_resource_requests,
        cluster_resource_constraints=state.cluster_resource_constraints,
    )
    base = state_to_input(demand_only, cluster, now_s)
    nodes = {n.node_id: n for n in ray_nodes}
    out: list[NodeInstance] = []
    claimed: set[str] = set()
    for inst in instances.values():
        if not is_ray_running_reachable(inst.status):
            continue
        node = nodes.get(inst.node_id) if inst.node_id else None
        live = node is not None and node.status in _LIVE
        if live:
            claimed.add(inst.node_id)
        resize = ippr.get(node.instance_id if live and node is not None else inst.cloud_instance_id)
        hit = last.get(inst.instance_id)
        if (
            hit is not None
            and hit[0] is inst
            and hit[1] is (node if live else None)
            and hit[2].ippr == resize
        ):
            made = hit[2]
        elif live:
            assert node is not None
            made = node_instance(node, inst.instance_id, inst.status, inst, ippr)
        else:
            made = NodeInstance(
                instance_id=inst.instance_id,
                node_type=inst.instance_type,
                status=inst.status,
                kind=inst.node_kind,
                ray_node_id=inst.node_id,
                cloud_instance_id=inst.cloud_instance_id,
                ippr=resize,
            )
        if memo is not None:
            memo[inst.instance_id] = (inst, node if live else None, made)
        out.append(made)
    for node in ray_nodes:  # nodes no instance tracks (unmanaged): capacity, never terminated
        if node.node_id not in claimed and node.status in _LIVE:
            out.append(
                node_instance(node, f"ray:{node.node_id}", InstanceStatus.RAY_RUNNING, None, ippr)
            )
    return SchedulingInput(
        config=base.config,
        instances=tuple(out),
        demands=base.demands,
        gangs=base.gangs,
        constraints=base.constraints,
        now_s=now_s,
    )


def node_instance(
    node: RayNode,
    instance_id: str,
    status: InstanceStatus,
    inst: Instance | None,
    ippr: Mapping[str, IpprStatus] | None = None,
) -> NodeInstance:
    kind = NodeKind.HEAD if node.is_head else (inst.node_kind if inst else NodeKind.WORKER)
    return NodeInstance(
        instance_id=instance_id,
        node_type=node.node_type or (inst.instance_type if inst else ""),
        status=status,
        kind=kind,
        ray_node_id=node.node_id,
        total=node.total,
        available=node.available,
        labels=node.labels,
        idle_duration_ms=node.idle_duration_ms,
        cloud_instance_id=node.instance_id,
        ippr=(ippr or {}).get(node.instance_id),
    )
