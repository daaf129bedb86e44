"""Task and actor demand, grouped by shape: packed on the nodes as placed so far, the rest
waits with a verdict (a step of a round, :mod:`.round_state`)."""

from __future__ import annotations

from gcs.policy.autoscaling.scheduler.nodes import NodeStatus, Source
from gcs.policy.autoscaling.scheduler.packing import try_schedule
from gcs.policy.autoscaling.scheduler.resources import shape_text
from gcs.policy.autoscaling.scheduler.round_state import Round
from gcs.policy.autoscaling.scheduler.types import (
    Decision,
    ResourceDemand,
    WaitingDemand,
    WaitKind,
    WaitReason,
)
from gcs.policy.autoscaling.scheduler.waiting import unplaced_verdict

__all__ = ["schedule_demand"]


def schedule_demand(r: Round) -> list[ResourceDemand]:
    res = try_schedule(r.nodes, [(d, d.count) for d in r.inp.demands], Source.DEMAND, r.pack)
    r.nodes = res.nodes
    r.notes.extend(res.launches)
    out = []
    limited, full = r.limited(), r.cluster_full()
    for d, n in res.leftover:
        out.append(ResourceDemand(d.resources, n, d.selectors, d.affinity, d.anti_affinity))
        verdict, why = unplaced_verdict(d, n, r.cfg.node_types, limited, r.blocked_why, full)
        r.reasons.append(Decision(verdict.value, shape_text(d.resources), why))
        r.waiting.append(
            WaitingDemand(WaitKind.TASKS, d.resources, n, verdict, why, selectors=d.selectors)
        )
    _waiting_on_new_nodes(r)
    return out


def _waiting_on_new_nodes(r: Round) -> None:
    """Task demand placed on nodes not running Ray yet (launched this round or earlier)
    waits for those nodes to come up."""
    mine = {id(d) for d in r.inp.demands}
    per: dict[int, tuple[ResourceDemand, int, dict[str, int]]] = {}
    for n in r.nodes:
        if n.is_running or n.status is NodeStatus.TO_TERMINATE or not n.placed[Source.DEMAND]:
            continue
        for d, k in n.placed[Source.DEMAND]:
            if id(d) not in mine:
                continue
            _, total, types = per.get(id(d), (d, 0, {}))
            types[n.node_type] = types.get(n.node_type, 0) + 1
            per[id(d)] = (d, total + k, types)
    for d, k, types in per.values():
        nodes = ", ".join(f"{c} x {t}" for t, c in types.items())
        why = f"{k} pending {shape_text(d.resources)} requests wait for {nodes} being added"
        r.waiting.append(
            WaitingDemand(
                WaitKind.TASKS,
                d.resources,
                k,
                WaitReason.PENDING_CAPACITY,
                why,
                selectors=d.selectors,
            )
        )
