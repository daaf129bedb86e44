"""Reasons a person can act on, from what the packer decided (pure: values in, text out).

The packer ranks candidate node types by Ray 2.60's score tuple (label score, GPU left
idle or not, matching resource kinds, min and mean of ``total * util**3``).  Those numbers
explain nothing to an operator ("min util 1, avg util 2.5" has no unit and exceeds 1), so
each decision is told in the terms of the config: which types could hold the request at
all, what the others lack, which limit or outage kept a type out, and what the runner-up
would have wasted.  The raw tuple stays available as the decision's ``detail`` (``gcs
autoscaler plan -v``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gcs.base.units import format_quantity
from gcs.policy.autoscaling.scheduler.resources import fit_count, shape_text
from gcs.policy.autoscaling.scheduler.scoring import Score
from gcs.policy.autoscaling.scheduler.types import NodeTypeConfig, ResourceDemand

Placed = Sequence[tuple[ResourceDemand, int]]


def score_text(score: Score) -> str:
    """Ray's score tuple with each term named (``-v``): compared in this order."""
    label, gpu_ok, matching, min_u, mean_u = score
    return (
        f"label match {label}, keeps GPUs for GPU work {'yes' if gpu_ok else 'no'}, "
        f"requested resource kinds it has {matching}, "
        f"min total*util^3 {min_u:.3g}, mean total*util^3 {mean_u:.3g}"
    )


def _needs(placed: Placed) -> dict[str, float]:
    """The largest amount of each resource one placed request asks for."""
    need: dict[str, float] = {}
    for d, _ in placed:
        for k, v in d.resources.items():
            if v > 0:
                need[k] = max(need.get(k, 0.0), v)
    return need


def _lacks(cfg: NodeTypeConfig, need: Mapping[str, float]) -> list[str]:
    return [k for k, v in sorted(need.items()) if cfg.resources.get(k, 0.0) < v]


def _leftover(cfg: NodeTypeConfig, placed: Placed) -> tuple[dict[str, float], int]:
    """What a fresh node of ``cfg`` has left after taking as much of ``placed`` as fits, and
    how many requests it took."""
    avail = {k: float(v) for k, v in cfg.resources.items()}
    took = 0
    for d, k in placed:
        n = fit_count(avail, d.resources, k)
        for name, v in d.resources.items():
            avail[name] = avail.get(name, 0.0) - v * n
        took += n
    return avail, took


def _waste(cfg: NodeTypeConfig, placed: Placed) -> str:
    """``3 of 4 CPU idle`` for the resource left most unused (by fraction)."""
    left, _ = _leftover(cfg, placed)
    worst = None
    for name, total in cfg.resources.items():
        if total <= 0 or name.startswith("node:"):
            continue
        frac = max(0.0, left.get(name, 0.0)) / total
        if worst is None or frac > worst[0]:
            worst = (frac, name, max(0.0, left.get(name, 0.0)), total)
    if worst is None or worst[0] == 0:
        return "nothing idle"
    _, name, unused, total = worst
    return f"{format_quantity(name, unused)} of {format_quantity(name, total)} {name} idle"


def _what(placed: Placed) -> str:
    return ", ".join(f"{k} x {shape_text(d.resources)}" for d, k in placed)


def explain_choice(
    chosen: str,
    placed: Placed,
    runner_up: tuple[str, Score] | None,
    configs: Mapping[str, NodeTypeConfig],
    excluded: Mapping[str, str],
) -> str:
    """Why ``chosen`` was launched for ``placed``: e.g. ``gpu1 chosen: only type with GPU``
    or ``cpu4 chosen: gpu1 would leave its GPU idle``.  ``excluded``: type -> why it could
    not be launched now (max_workers reached, capacity unavailable)."""
    need = _needs(placed)
    fitting = [t for t, cfg in configs.items() if not _lacks(cfg, need)]
    others = [t for t in fitting if t != chosen]
    if runner_up is not None:
        return f"{chosen} chosen: {_versus(chosen, placed, runner_up, configs)}"
    if not others:
        rest = [cfg for t, cfg in configs.items() if t != chosen]
        unique = [k for k in sorted(need) if rest and all(k in _lacks(cfg, need) for cfg in rest)]
        if unique:
            return f"{chosen} chosen: the only node type with {' and '.join(unique)}"
        return f"{chosen} chosen: the only node type that fits {shape_text(need)}"
    why = [f"{t} {excluded.get(t, 'cannot take more now')}" for t in others]
    return f"{chosen} chosen: the other types that fit are out ({'; '.join(why)})"


def _versus(
    chosen: str,
    placed: Placed,
    runner_up: tuple[str, Score],
    configs: Mapping[str, NodeTypeConfig],
) -> str:
    """Chosen vs. runner-up, on the first term of Ray's score where they differ."""
    other, other_score = runner_up
    cfg, other_cfg = configs[chosen], configs[other]
    missing = _lacks(other_cfg, _needs(placed))
    if missing:
        return f"{other} has no {' and '.join(missing)} for some of these requests"
    _, took = _leftover(cfg, placed)
    _, other_took = _leftover(other_cfg, placed)
    if other_took < took:
        return (
            f"it takes {took} of the requests, {other} only {other_took} "
            f"({other} would have {_waste(other_cfg, placed)})"
        )
    label, gpu_ok, matching, *_ = other_score
    if label == 0 and any(d.selectors for d, _ in placed):
        return f"{other}'s labels do not match the request's label selector"
    if not gpu_ok and other_cfg.resources.get("GPU", 0) > 0:
        return f"{other} would leave its GPU idle for non-GPU work"
    mine = sum(1 for k in _needs(placed) if k in cfg.resources)
    if matching < mine:
        return f"{other} lacks some of the requested resource kinds"
    mine_waste, other_waste = _waste(cfg, placed), _waste(other_cfg, placed)
    if mine_waste != other_waste:
        return f"{chosen} would have {mine_waste}; {other} would have {other_waste}"
    return f"it ties with {other}; the first in the config's order wins, as in Ray"


def explain_unplaced(
    resources: Mapping[str, float],
    count: int,
    configs: Mapping[str, NodeTypeConfig],
    excluded: Mapping[str, str],
    cluster_full: str | None,
) -> str:
    """Why ``count`` requests of ``resources`` got no node: no type has the resources, or
    every type that has them is excluded (``excluded``: type -> why), or the cluster cap
    (``cluster_full``, e.g. ``max_workers 10 reached``) stopped the launch."""
    need = {k: v for k, v in resources.items() if v > 0}
    fitting = {t: cfg for t, cfg in configs.items() if not _lacks(cfg, need)}
    head = f"{count} pending {shape_text(resources)} requests"
    if not fitting:
        gaps = []
        for name, amount in sorted(need.items()):
            best = max((cfg.resources.get(name, 0.0) for cfg in configs.values()), default=0.0)
            if best < amount:
                gaps.append(
                    f"no node type has {name}"
                    if best == 0
                    else f"{name} {format_quantity(name, amount)} > the most any type has "
                    f"({format_quantity(name, best)})"
                )
        return f"{head} fit no node type: {'; '.join(gaps)}; change the request or add a type"
    why = [f"{t} {excluded[t]}" for t in fitting if t in excluded]
    if cluster_full is not None:
        why.append(f"cluster {cluster_full}")
    if not why:
        why = ["their label selectors or placement constraints match no node type"]
    return f"{head} cannot be placed now: {'; '.join(why)}"
