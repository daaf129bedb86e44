"""Scale-down at the end of a round: the pending-idle clocks, the disruption budget and idle
termination (steps of a round, :mod:`.round_state`)."""

from __future__ import annotations

import math
from collections import defaultdict

from gcs.policy.autoscaling.scheduler.nodes import NodeStatus, Source, WorkNode
from gcs.policy.autoscaling.scheduler.round_state import Round
from gcs.policy.autoscaling.scheduler.termination import enforce_idle, is_leaving
from gcs.policy.autoscaling.scheduler.types import Decision, InstanceStatus, NodeKind

__all__ = ["budget", "idle", "pending_idle"]


def pending_idle(r: Round) -> dict[str, tuple[float, ...]]:
    """Ray keeps per-type clocks for unneeded pending nodes; we carry them in the reply."""
    timeout = r.cfg.pending_idle_timeout_s
    if timeout is None:
        return {}
    rank = {
        InstanceStatus.QUEUED: 0,
        InstanceStatus.ALLOCATED: 1,
        InstanceStatus.RAY_INSTALLING: 2,
    }
    by_type: dict[str, list[WorkNode]] = defaultdict(list)
    for n in r.nodes:
        if (
            n.status is NodeStatus.SCHEDULABLE
            and n.kind is NodeKind.WORKER
            and n.im_status in rank
            and not n.placed[Source.DEMAND]
            and not n.placed[Source.CONSTRAINT]
        ):
            by_type[n.node_type].append(n)
    clocks: dict[str, tuple[float, ...]] = {}
    for t, group in by_type.items():
        old = sorted(r.inp.pending_since_s.get(t, ()))[: len(group)]
        stamps = old + [r.inp.now_s] * (len(group) - len(old))
        group.sort(key=lambda n: rank[n.im_status])  # type: ignore[index]
        for n, ts in zip(group, stamps, strict=True):
            n.idle_duration_ms = round((r.inp.now_s - ts) * 1000)
        clocks[t] = tuple(stamps)
    return clocks


def budget(r: Round) -> tuple[int, int] | None:
    """The disruption budget and how much of it is spent before idle termination starts
    (None = no budget).

    A budget caps the nodes being disrupted at once, not per round: the nodes already
    on their way out spend it.  Those are the workers leaving from an earlier round
    (RAY_STOP_REQUESTED: a drain is reported a round or more later, so counting per
    round let each round take a whole budget again) and the workers this round already
    terminates (outdated, over max: never held back by the budget, as in Ray, but they
    disrupt all the same).  Karpenter counts alike: allowed = budget(total) - nodes
    being deleted for any reason - nodes not ready.  Ray 2.60 has no budget (its
    scheduler counts a leaving node as present everywhere).  The percentage is of the
    non-head nodes, the leaving ones included: they are still nodes, as Karpenter's
    total keeps nodes marked for deletion."""
    o = r.opts
    if o.disruption_budget_nodes is None and o.disruption_budget_percent is None:
        return None
    limits = []
    if o.disruption_budget_nodes is not None:
        limits.append(o.disruption_budget_nodes)
    workers = spent = 0
    for n in r.nodes:
        if n.kind is NodeKind.WORKER and n.instance is not None:
            workers += 1
            if n.status is NodeStatus.TO_TERMINATE or is_leaving(n):
                spent += 1
    if o.disruption_budget_percent is not None:
        limits.append(max(1, math.floor(workers * o.disruption_budget_percent / 100)))
    return min(limits), spent


def idle(r: Round) -> None:
    r.forget_limits()  # idle termination marks nodes of this very list
    keep: list[tuple[str, str]] = []
    allowed = budget(r)
    limit, spent = allowed if allowed is not None else (None, 0)
    enforce_idle(r.nodes, r.cfg, r.protected, limit, keep, spent)
    for who, why in keep:
        r.reasons.append(Decision("keep", who, f"keep node {who}: {why}"))
