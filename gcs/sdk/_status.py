"""A small typed view of ``GetClusterStatusReply`` for code that wants numbers, not protos."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from gcs.proto import autoscaler_pb2, common_pb2


@dataclass(frozen=True)
class ResourceDemand:
    shape: Mapping[str, float]
    count: int
    label_selectors: tuple[str, ...] = ()
    """Each selector as ``key in (a,b)`` / ``key !in (a)`` clauses joined by ``; ``."""


@dataclass(frozen=True)
class ClusterStatusSummary:
    session_name: str
    cluster_resource_state_version: int
    autoscaler_state_version: int
    nodes_by_status: Mapping[str, int]
    """NodeStatus name (RUNNING, IDLE, DRAINING, DEAD, ...) -> node count."""
    total_resources: Mapping[str, float]
    """Summed over nodes that are not DEAD."""
    available_resources: Mapping[str, float]
    pending_demands: tuple[ResourceDemand, ...]
    constraints: tuple[ResourceDemand, ...]
    """What ``request_resources`` asked for (the cluster resource constraints)."""
    pending_instances: int
    failed_instance_requests: int

    @classmethod
    def from_reply(cls, reply: autoscaler_pb2.GetClusterStatusReply) -> ClusterStatusSummary:
        state = reply.cluster_resource_state
        scaling = reply.autoscaling_state
        by_status: Counter[str] = Counter()
        total: Counter[str] = Counter()
        available: Counter[str] = Counter()
        for node in state.node_states:
            by_status[autoscaler_pb2.NodeStatus.Name(node.status)] += 1
            if node.status != autoscaler_pb2.DEAD:
                total.update(dict(node.total_resources))
                available.update(dict(node.available_resources))
        return cls(
            session_name=state.cluster_session_name,
            cluster_resource_state_version=state.cluster_resource_state_version,
            autoscaler_state_version=scaling.autoscaler_state_version,
            nodes_by_status=dict(by_status),
            total_resources=dict(total),
            available_resources=dict(available),
            pending_demands=tuple(_demand(r) for r in state.pending_resource_requests),
            constraints=tuple(
                _demand(r)
                for constraint in state.cluster_resource_constraints
                for r in constraint.resource_requests
            ),
            pending_instances=len(scaling.pending_instances),
            failed_instance_requests=len(scaling.failed_instance_requests),
        )


def _clause(c: common_pb2.LabelSelectorConstraint) -> str:
    op = "!in" if c.operator == common_pb2.LABEL_OPERATOR_NOT_IN else "in"
    return f"{c.label_key} {op} ({','.join(c.label_values)})"


def _demand(by_count: autoscaler_pb2.ResourceRequestByCount) -> ResourceDemand:
    selectors = tuple(
        "; ".join(_clause(c) for c in selector.label_constraints)
        for selector in by_count.request.label_selectors
    )
    return ResourceDemand(dict(by_count.request.resources_bundle), by_count.count, selectors)
