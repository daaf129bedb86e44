"""``request_resources`` constraints and placement groups: each placed whole or not at all,
with a verdict on what waits (steps of a round, :mod:`.round_state`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from gcs.policy.autoscaling.scheduler.nodes import NodeStatus, Source
from gcs.policy.autoscaling.scheduler.packing import try_schedule
from gcs.policy.autoscaling.scheduler.resources import shape_text
from gcs.policy.autoscaling.scheduler.round_state import Round
from gcs.policy.autoscaling.scheduler.types import (
    ClusterConstraint,
    Decision,
    GangRequest,
    ResourceDemand,
    WaitingDemand,
    WaitKind,
    WaitReason,
)
from gcs.policy.autoscaling.scheduler.waiting import gang_verdict

__all__ = ["combine_affinity", "schedule_constraints", "schedule_gangs"]


def combine_affinity(bundles: tuple[ResourceDemand, ...]) -> list[tuple[ResourceDemand, int]]:
    """Ray's ``combine_requests_with_affinity``: STRICT_PACK bundles become one request."""
    out: list[tuple[ResourceDemand, int]] = []
    merged: dict[tuple, list[ResourceDemand]] = {}
    for b in bundles:
        if b.affinity is None:
            out.append((b, b.count))
            continue
        merged.setdefault((b.affinity, b.selectors), []).extend([b] * b.count)
    for (aff, _), parts in merged.items():
        total: dict[str, float] = defaultdict(float)
        for p in parts:
            for k, v in p.resources.items():
                total[k] += v
        out.append((ResourceDemand(dict(total), 1, parts[0].selectors, affinity=aff), 1))
    return out


def schedule_constraints(r: Round) -> list[ClusterConstraint]:
    infeasible = []
    for c in r.inp.constraints:
        res = try_schedule(r.nodes, [(b, b.count) for b in c.bundles], Source.CONSTRAINT, r.pack)
        if res.leftover:
            infeasible.append(c)
            left = ", ".join(f"{n} x {shape_text(d.resources)}" for d, n in res.leftover)
            verdict, why = _limits_verdict(r, [(b, b.count) for b in c.bundles], Source.CONSTRAINT)
            r.reasons.append(
                Decision(
                    verdict.value,
                    "request_resources",
                    f"constraint cannot be met ({left} do not fit: {why}); nothing launched for it",
                )
            )
            _wait(r, WaitKind.CONSTRAINT, c.bundles, verdict, why, "request_resources")
            continue
        r.nodes = res.nodes
        r.notes.extend(res.launches)
    return infeasible


def schedule_gangs(r: Round) -> list[GangRequest]:
    def key(g: GangRequest) -> tuple[int, int]:
        constraints = sum(b.count for b in g.bundles if b.affinity or b.anti_affinity)
        return (constraints, sum(b.count for b in g.bundles))

    infeasible = []
    for g in sorted(r.inp.gangs, key=key, reverse=True):
        placed = _replace_lost_bundles(r, g)
        if placed is not None:
            if not placed:
                infeasible.append(g)
                if g.bundles[0].anti_affinity is None:  # STRICT_PACK: only with survivors
                    verdict = WaitReason.INFEASIBLE
                    why = "lost bundles must join the survivors' nodes, which lack room"
                else:
                    verdict, why = _limits_verdict(r, combine_affinity(g.bundles), Source.DEMAND)
                _wait(r, WaitKind.PLACEMENT_GROUP, g.bundles, verdict, why, g.details)
            continue
        options = [g.bundles] + (list(g.fallbacks) if r.opts.gang_fallbacks else [])
        for bundles in options:
            res = try_schedule(r.nodes, combine_affinity(bundles), Source.DEMAND, r.pack)
            if not res.leftover:
                r.nodes = res.nodes
                r.notes.extend(res.launches)
                break
        else:
            infeasible.append(g)
            verdict, why = _limits_verdict(r, combine_affinity(g.bundles), Source.DEMAND)
            r.reasons.append(
                Decision(
                    verdict.value,
                    g.details or "placement group",
                    f"gang cannot be placed as a whole within node type limits: {why}",
                )
            )
            _wait(r, WaitKind.PLACEMENT_GROUP, g.bundles, verdict, why, g.details)
    return infeasible


def _limits_verdict(
    r: Round, groups: list[tuple[ResourceDemand, int]], source: Source
) -> tuple[WaitReason, str]:
    """Why a gang or constraint did not place: the packer tries it once more with no
    node-type or cluster limit (and no type held back); if it places then, a limit
    stopped it."""
    unlimited = replace(
        r.pack,
        configs={n: replace(c, max_workers=1 << 30) for n, c in r.cfg.node_types.items()},
        max_num_nodes=None,
        blocked_types=frozenset(),
    )
    fits = not try_schedule(r.nodes, groups, source, unlimited).leftover
    return gang_verdict([d for d, _ in groups], fits, r.limited(), r.blocked_why, r.cluster_full())


def _wait(
    r: Round,
    kind: WaitKind,
    bundles: tuple[ResourceDemand, ...],
    verdict: WaitReason,
    why: str,
    details: str,
) -> None:
    """One waiting gang or constraint, shown by its largest bundle."""
    if not bundles:
        return
    big = max(bundles, key=lambda b: sum(b.resources.values()))
    r.waiting.append(WaitingDemand(kind, dict(big.resources), 1, verdict, why, "", details))


def _replace_lost_bundles(r: Round, g: GangRequest) -> bool | None:
    """ray#40212 (option): place a RESCHEDULING group's lost bundles relative to the
    nodes holding its surviving bundles. None = not applicable (Ray's way is used),
    else whether the lost bundles were placed.
    """
    if not (r.opts.lost_bundle_replacement and g.rescheduling and g.bundles):
        return None
    label = next(
        (b.affinity or b.anti_affinity for b in g.bundles if b.affinity or b.anti_affinity),
        None,
    )
    ids = set(g.survivor_nodes)
    survivors = [
        i
        for i, n in enumerate(r.nodes)
        if n.instance is not None
        and (
            (label is not None and n.labels.get(label[0]) == label[1])
            or n.instance_id in ids
            or (n.ray_node_id and n.ray_node_id in ids)
        )
    ]
    if not survivors or label is None:
        return None  # nothing known about the survivors, or no strict strategy
    names = ", ".join(r.nodes[i].instance_id for i in survivors)
    who = g.details or "placement group"
    lost = "; ".join(f"{b.count} x {shape_text(b.resources)}" for b in g.bundles)
    if g.bundles[0].anti_affinity is not None:
        nodes = list(r.nodes)
        for i in survivors:
            if nodes[i].labels.get(label[0]) != label[1]:
                nodes[i] = nodes[i].clone()
                nodes[i].labels[label[0]] = label[1]
        res = try_schedule(nodes, combine_affinity(g.bundles), Source.DEMAND, r.pack)
        if res.leftover:
            r.reasons.append(
                Decision(
                    "infeasible",
                    who,
                    f"lost bundles ({lost}) of a STRICT_SPREAD group need nodes other "
                    f"than {names} (holding its surviving bundles) within node type limits",
                )
            )
            return False
        r.nodes = res.nodes
        r.notes.extend(res.launches)
        r.reasons.append(
            Decision("replace", who, f"lost bundles ({lost}) placed away from {names}")
        )
        return True
    # STRICT_PACK: the lost bundles must join the survivors; no new node can host them.
    sub = [r.nodes[i] for i in survivors]
    pack = replace(r.pack, blocked_types=frozenset(r.cfg.node_types))
    res = try_schedule(sub, combine_affinity(g.bundles), Source.DEMAND, pack)
    if res.leftover:
        free = ", ".join(
            f"{n.instance_id} {shape_text(n.avail[Source.DEMAND])}"
            + (" (leaving)" if n.status is NodeStatus.TO_TERMINATE else "")
            for n in sub
        )
        r.reasons.append(
            Decision(
                "infeasible",
                who,
                f"lost bundles ({lost}) of a STRICT_PACK group must join its surviving "
                f"bundles on {names}, which lack room (free: {free}); a new node cannot "
                "host them",
            )
        )
        return False
    for i, node in zip(survivors, res.nodes, strict=True):
        r.nodes[i] = node
    r.reasons.append(
        Decision("replace", who, f"lost bundles ({lost}) placed with the survivors on {names}")
    )
    return True
