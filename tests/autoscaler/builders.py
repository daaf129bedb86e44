"""Short builders for scheduler inputs."""

from __future__ import annotations

from gcs.policy.autoscaling.model import InstanceStatus, NodeKind
from gcs.policy.autoscaling.scheduler import (
    NodeInstance,
    NodeTypeConfig,
    Options,
    ResourceDemand,
    SchedulerConfig,
    SchedulingInput,
)


def ntype(name: str, cpu: float = 4, mn: int = 0, mx: int = 10, **kw: object) -> NodeTypeConfig:
    return NodeTypeConfig(name=name, resources={"CPU": cpu}, min_workers=mn, max_workers=mx, **kw)  # type: ignore[arg-type]


def running(
    iid: str, t: str = "cpu", *, cpu: float = 4, free: float | None = None, idle_s: float = 0,
    labels: dict[str, str] | None = None, head: bool = False,
) -> NodeInstance:  # fmt: skip
    return NodeInstance(
        instance_id=iid, node_type=t, status=InstanceStatus.RAY_RUNNING,
        kind=NodeKind.HEAD if head else NodeKind.WORKER, ray_node_id=f"r{iid}",
        total={"CPU": cpu}, available={"CPU": cpu if free is None else free},
        labels=labels or {}, idle_duration_ms=int(idle_s * 1000),
    )  # fmt: skip


def cpu(n: int, amount: float = 1) -> ResourceDemand:
    return ResourceDemand({"CPU": amount}, n)


def inp(
    types: list[NodeTypeConfig], nodes: list[NodeInstance] = (), demands: list = (),  # type: ignore[assignment]
    options: Options | None = None, **cfg: object,
) -> SchedulingInput:  # fmt: skip
    config = SchedulerConfig(
        node_types={t.name: t for t in types},
        options=options or Options(),
        **cfg,  # type: ignore[arg-type]
    )
    return SchedulingInput(config=config, instances=tuple(nodes), demands=tuple(demands), **{})
