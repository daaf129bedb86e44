"""The scheduler's working copy of a node (private, mutable, cloned on write)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from gcs.policy.autoscaling.scheduler.types import (
    InstanceStatus,
    IpprSpec,
    IpprStatus,
    NodeInstance,
    NodeKind,
    NodeTypeConfig,
    ResourceDemand,
    Termination,
)


class Source(enum.IntEnum):
    """Which account a placement is charged to."""

    DEMAND = 0  # tasks, actors, placement groups: packed against available
    CONSTRAINT = 1  # request_resources: packed against totals


class NodeStatus(enum.Enum):
    SCHEDULABLE = "SCHEDULABLE"
    TO_LAUNCH = "TO_LAUNCH"
    TO_TERMINATE = "TO_TERMINATE"


@dataclass(eq=False, slots=True)
class WorkNode:
    node_type: str
    kind: NodeKind
    status: NodeStatus
    im_status: InstanceStatus | None
    total: dict[str, float]
    avail: tuple[dict[str, float], dict[str, float]]
    labels: dict[str, str]
    priority: int = 0
    instance: NodeInstance | None = None
    idle_duration_ms: int = 0
    launch_config_hash: str = ""
    #: Placed demand per source, in placement order (demand, count).
    placed: tuple[list[tuple[ResourceDemand, int]], list[tuple[ResourceDemand, int]]] = field(
        default_factory=lambda: ([], [])
    )
    termination: Termination | None = None
    #: Resize state and bounds; both set only for an IPPR-capable pod.
    ippr: IpprStatus | None = None
    ippr_spec: IpprSpec | None = None
    #: Why this round queued a resize of the pod ("" = not queued this round).
    resize_reason: str = ""

    @property
    def instance_id(self) -> str:
        return self.instance.instance_id if self.instance else ""

    @property
    def ray_node_id(self) -> str:
        return self.instance.ray_node_id if self.instance else ""

    @property
    def is_running(self) -> bool:
        return self.im_status is InstanceStatus.RAY_RUNNING

    def clone(self) -> WorkNode:
        return WorkNode(
            node_type=self.node_type,
            kind=self.kind,
            status=self.status,
            im_status=self.im_status,
            total=dict(self.total),
            avail=(dict(self.avail[0]), dict(self.avail[1])),
            labels=dict(self.labels),
            priority=self.priority,
            instance=self.instance,
            idle_duration_ms=self.idle_duration_ms,
            launch_config_hash=self.launch_config_hash,
            placed=(list(self.placed[0]), list(self.placed[1])),
            termination=self.termination,
            ippr=self.ippr,
            ippr_spec=self.ippr_spec,
            resize_reason=self.resize_reason,
        )

    def set_totals(self, totals: dict[str, float]) -> None:
        """Ray's ``update_total_resources``: move totals, shift every available map alike."""
        for name, value in totals.items():
            delta = value - self.total.get(name, 0.0)
            self.total[name] = max(0.0, value)
            for avail in self.avail:
                avail[name] = max(0.0, avail.get(name, 0.0) + delta)


def from_type(cfg: NodeTypeConfig, status: NodeStatus = NodeStatus.TO_LAUNCH) -> WorkNode:
    """A node that does not run Ray yet: it has its type's resources and labels."""
    res = {k: float(v) for k, v in cfg.resources.items()}
    return WorkNode(
        node_type=cfg.name,
        kind=NodeKind.WORKER,
        status=status,
        im_status=None,
        total=dict(res),
        avail=(dict(res), dict(res)),
        labels=dict(cfg.labels),
        priority=cfg.priority,
        launch_config_hash=cfg.launch_config_hash,
    )


def from_instance(
    inst: NodeInstance, configs: dict[str, NodeTypeConfig], check_launch_config: bool
) -> WorkNode | None:
    """Ray's ``SchedulingNode.new``; None when the instance takes no part."""
    node = _from_instance(inst, configs, check_launch_config)
    cfg = configs.get(inst.node_type)
    if node is not None and inst.ippr is not None and cfg is not None and cfg.ippr is not None:
        # Ray keys statuses by pod name; a running node's raylet id overrides the annotation's.
        node.ippr = replace(inst.ippr, raylet_id=inst.ray_node_id or inst.ippr.raylet_id)
        node.ippr_spec = cfg.ippr
    return node


def _from_instance(
    inst: NodeInstance, configs: dict[str, NodeTypeConfig], check_launch_config: bool
) -> WorkNode | None:
    cfg = configs.get(inst.node_type)
    if inst.status is InstanceStatus.RAY_RUNNING:
        total = {k: float(v) for k, v in inst.total.items()}
        return WorkNode(
            node_type=inst.node_type,
            kind=inst.kind,
            status=NodeStatus.SCHEDULABLE,
            im_status=inst.status,
            total=total,
            avail=({k: float(v) for k, v in inst.available.items()}, dict(total)),
            labels=dict(inst.labels),
            priority=cfg.priority if cfg else 0,
            instance=inst,
            idle_duration_ms=inst.idle_duration_ms,
            launch_config_hash=inst.launch_config_hash,
        )
    if cfg is None:
        if not check_launch_config:
            return None
        node = WorkNode(
            node_type=inst.node_type,
            kind=inst.kind,
            status=NodeStatus.TO_TERMINATE,
            im_status=inst.status,
            total={},
            avail=({}, {}),
            labels={},
            instance=inst,
        )
        return node
    node = from_type(cfg, NodeStatus.SCHEDULABLE)
    node.kind = inst.kind
    node.im_status = inst.status
    node.instance = inst
    node.launch_config_hash = inst.launch_config_hash
    return node
