"""Which nodes go first when nodes must go, and idle termination (Ray 2.60 rules)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gcs.policy.autoscaling.scheduler.nodes import NodeStatus, Source, WorkNode
from gcs.policy.autoscaling.scheduler.types import (
    PENDING_TERMINABLE_STATUSES,
    InstanceStatus,
    NodeKind,
    SchedulerConfig,
    Termination,
    TerminationCause,
)


def termination_order(node: WorkNode) -> tuple:
    """Ascending = terminated first: not running Ray, then longest idle, then least used."""
    avail = node.avail[Source.DEMAND]
    utils = [(t - avail.get(k, 0)) / t for k, t in node.total.items() if t > 0]
    return (
        len(node.ray_node_id) > 0,
        -node.idle_duration_ms,
        sum(utils) / len(utils) if utils else 0,
    )


def is_leaving(node: WorkNode) -> bool:
    """Chosen for termination in an earlier round and still on its way out: RAY_STOP_REQUESTED
    (its drain in flight, or accepted and not yet reported as draining; a rejected or timed
    out drain puts it back to RAY_RUNNING).  Later statuses are not in the input at all."""
    return node.im_status is InstanceStatus.RAY_STOP_REQUESTED


def mark(node: WorkNode, cause: TerminationCause, reason: str) -> None:
    node.status = NodeStatus.TO_TERMINATE
    if node.instance is None:
        return  # a node we were about to launch: simply not launched
    node.termination = Termination(
        instance_id=node.instance_id,
        ray_node_id=node.ray_node_id,
        node_type=node.node_type,
        cause=cause,
        instance_status=node.im_status,  # type: ignore[arg-type]
        reason=reason,
        idle_duration_ms=node.idle_duration_ms if cause is TerminationCause.IDLE else 0,
    )


def select_excess(
    nodes: list[WorkNode],
    excess: int,
    cause: TerminationCause,
    reason: str,
    protected: Callable[[WorkNode], bool],
) -> tuple[list[WorkNode], list[WorkNode]]:
    """Ray's ``_select_nodes_to_terminate``: sort, never the head; returns (gone, kept)."""
    nodes = sorted(nodes, key=termination_order)
    head = next((n for n in nodes if n.kind is NodeKind.HEAD), None)
    if head is not None:
        nodes.remove(head)
    gone: list[WorkNode] = []
    kept: list[WorkNode] = []
    for n in nodes:
        if len(gone) < excess and not protected(n):
            gone.append(n)
        else:
            kept.append(n)
    for n in gone:
        mark(n, cause, reason)
    return gone, kept + ([head] if head else [])


def _in_use(node: WorkNode) -> bool:
    """Work is running there (a guard against an idle clock that disagrees with usage)."""
    inst = node.instance
    assert inst is not None
    return any(inst.available.get(k, 0) < v for k, v in inst.total.items() if v > 0)


def idle_timeout_for(node: WorkNode, cfg: SchedulerConfig) -> float | None:
    if node.im_status in PENDING_TERMINABLE_STATUSES:
        return cfg.pending_idle_timeout_s
    t = cfg.node_types.get(node.node_type)
    if t is not None and t.idle_timeout_s is not None:
        return t.idle_timeout_s
    return cfg.idle_timeout_s


def enforce_idle(
    nodes: Sequence[WorkNode],
    cfg: SchedulerConfig,
    protected: Callable[[WorkNode], bool],
    budget: int | None,
    keep_reasons: list[tuple[str, str]],
    spent: int = 0,
) -> int:
    """Mark idle nodes TO_TERMINATE; returns how many were marked.

    ``budget`` caps the nodes leaving at once; ``spent`` of it is taken by nodes already
    leaving (see :func:`.idle.budget`).

    min_workers counts the nodes that stay.  A RAY_STOP_REQUESTED node was chosen in an
    earlier round and is leaving (its drain in flight, or accepted and not yet reported as
    draining): Ray 2.60 counts it as staying, so the round after an idle scale-down
    terminates the min_workers nodes too and the next one launches replacements."""
    shape: dict[str, int] = {}
    leaving: dict[str, int] = {}
    for n in nodes:
        if n.status is NodeStatus.TO_TERMINATE:
            continue
        if is_leaving(n):
            leaving[n.node_type] = leaving.get(n.node_type, 0) + 1
        else:
            shape[n.node_type] = shape.get(n.node_type, 0) + 1
    gone: dict[str, int] = {}
    total = 0
    # Only nodes idle past their timeout are candidates; the sort is stable, so sorting
    # just them visits them in the same order as sorting all and skipping the rest.
    candidates = []
    for n in nodes:
        if n.status is not NodeStatus.SCHEDULABLE or n.kind is NodeKind.HEAD:
            continue
        timeout = idle_timeout_for(n, cfg)
        if timeout is None or n.idle_duration_ms <= timeout * 1000:
            continue
        candidates.append((n, timeout))
    candidates.sort(key=lambda c: termination_order(c[0]))
    for n, timeout in candidates:
        who = n.instance_id or n.node_type
        if n.placed[Source.DEMAND]:
            keep_reasons.append(
                (who, f"idle {n.idle_duration_ms / 1000:g} s but pending demand lands on it")
            )
            continue
        if n.placed[Source.CONSTRAINT]:
            keep_reasons.append((who, "needed by request_resources"))
            continue
        if n.instance is not None and n.is_running and _in_use(n):
            keep_reasons.append((who, "resources in use although reported idle"))
            continue
        t = cfg.node_types.get(n.node_type)
        min_count = t.min_workers if t else 0
        if shape.get(n.node_type, 0) - gone.get(n.node_type, 0) <= min_count:
            why = f"min_workers of {n.node_type} is {min_count}"
            if k := leaving.get(n.node_type, 0):
                why += f" ({k} already stopping)"
            keep_reasons.append((who, why))
            continue
        if protected(n):
            keep_reasons.append((who, "do-not-disrupt label"))
            continue
        if budget is not None and spent + total >= budget:
            why = f"disruption budget of {budget} node(s) used"
            if spent:
                why += f" ({spent} already leaving)"
            keep_reasons.append((who, why))
            continue
        verb = "idle" if n.ray_node_id else "pending and not needed"
        mark(
            n,
            TerminationCause.IDLE,
            f"{verb} for {n.idle_duration_ms / 1000:g} s > timeout {timeout:g} s",
        )
        gone[n.node_type] = gone.get(n.node_type, 0) + 1
        total += 1
    return total
