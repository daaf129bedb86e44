"""What a reconcile round observes: Ray nodes (from the GCS) and its settings."""

from __future__ import annotations

from dataclasses import dataclass

from gcs.policy.autoscaling.model import HEAD_RESOURCE, RayNode, RayNodeStatus
from gcs.proto import autoscaler_pb2

__all__ = [
    "HEAD_RESOURCE",
    "RayNode",
    "RayNodeReader",
    "RayNodeStatus",
    "ReconcileConfig",
    "ray_nodes_from_state",
]

_STATUS = {s.value: s for s in RayNodeStatus}


def ray_nodes_from_state(state: autoscaler_pb2.ClusterResourceState) -> list[RayNode]:
    """One :class:`RayNode` per node state."""
    return [_ray_node(ns) for ns in state.node_states]


def _ray_node(ns: autoscaler_pb2.NodeState) -> RayNode:
    total = dict(ns.total_resources)
    static, dynamic = ns.labels, ns.dynamic_labels
    return RayNode(
        node_id=ns.node_id.hex(),
        status=_STATUS.get(ns.status, RayNodeStatus.UNSPECIFIED),
        instance_id=ns.instance_id,
        node_type=ns.ray_node_type_name,
        is_head=HEAD_RESOURCE in total,
        total=total,
        available=dict(ns.available_resources),
        labels={**static, **dynamic} if len(static) or len(dynamic) else {},
        idle_duration_ms=ns.idle_duration_ms,
        ip_address=ns.node_ip_address,
    )


class RayNodeReader:
    """:func:`ray_nodes_from_state` with a memory of the last round: a node state whose
    bytes are unchanged gives back the same :class:`RayNode` (converting the protobuf maps
    is most of a round's parsing; serializing to compare is ~50x cheaper)."""

    def __init__(self) -> None:
        self._last: dict[bytes, RayNode] = {}

    def read(self, state: autoscaler_pb2.ClusterResourceState) -> list[RayNode]:
        last, now, out = self._last, {}, []
        for ns in state.node_states:
            key = ns.SerializeToString(deterministic=True)
            node = last.get(key)
            if node is None:
                node = _ray_node(ns)
            now[key] = node
            out.append(node)
        self._last = now
        return out


@dataclass(frozen=True, slots=True)
class ReconcileConfig:
    """Ray 2.60's ``InstanceReconcileConfig`` defaults and the launch-rate knobs (§1.13, §2.5).

    No node updaters (Ray's steps 6 and 13, installing Ray on ALLOCATED instances): our
    providers start Ray themselves, so RAY_INSTALLING is never entered."""

    request_status_timeout_s: float = 600
    max_num_retry_request_to_allocate: int = 3
    allocate_status_timeout_s: float = 3600
    ray_install_status_timeout_s: float = 1800
    terminating_status_timeout_s: float = 300
    ray_stop_requested_status_timeout_s: float = 300
    transient_status_warn_interval_s: float = 90
    upscaling_speed: float = 0.0
    max_concurrent_launches: int = 10
