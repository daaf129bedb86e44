"""Bundle placement: which node each bundle of a placement group goes to.  Pure.

Values in, values out: nodes (available and total resources, labels) and groups in, one
:class:`Placement` per group out.  No clock, no I/O; order is total (nodes in the order
given, bundles largest first then by index), so every run gives the same answer.

Strategies, with Ray 2.60's soft / strict meaning:

* ``PACK`` (soft): as few nodes as possible - each round the node that takes the most of
  the remaining bundles wins (best fit breaks ties); spills over to more nodes if needed.
* ``SPREAD`` (soft): each bundle on a node no other bundle of the group uses, when one
  fits; otherwise on any node that fits.
* ``STRICT_PACK``: all bundles on one node (the sum must fit); ``soft_target_node_id`` is
  preferred when it fits; bundles being rescheduled must join the node of the placed ones.
* ``STRICT_SPREAD``: every bundle on its own node, never a node holding another bundle of
  the group (placed bundles included, so a rescheduled bundle avoids the survivors).

A bundle with a label selector only goes to nodes whose labels match it (hard, all
strategies).  A group restricted to a virtual cluster (``allowed``) only sees its nodes.

Outcomes: ``PLACED`` (every unplaced bundle has a node), ``NO_RESOURCES`` (it would fit the
nodes' totals: retry when resources free up) or ``INFEASIBLE`` (it cannot fit even on empty
nodes of the current cluster: wait for new nodes).  Successive groups of one call see the
resources the earlier ones took.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gcs.labels import selector_proto
from gcs.proto import common_pb2

EPSILON = 1e-9
PACK = common_pb2.PACK
SPREAD = common_pb2.SPREAD
STRICT_PACK = common_pb2.STRICT_PACK
STRICT_SPREAD = common_pb2.STRICT_SPREAD

Constraint = tuple[str, bool, tuple[str, ...]]
"""(label key, negated (NOT_IN), values)."""
Resources = Mapping[str, float]


def selector_from_map(selector: Mapping[str, str]) -> tuple[Constraint, ...]:
    """A bundle's ``label_selector`` map in Ray's syntax (``"a"``, ``"!a"``, ``"in(a,b)"``)."""
    return tuple(
        (
            c.label_key,
            c.operator == common_pb2.LABEL_OPERATOR_NOT_IN,
            tuple(c.label_values),
        )
        for c in selector_proto(selector).label_constraints
    )


def matches(selector: Iterable[Constraint], labels: Mapping[str, str]) -> bool:
    for key, negated, values in selector:
        present = labels.get(key) in values
        if present == negated:
            return False
    return True


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: bytes
    available: Resources
    total: Resources
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BundleDemand:
    index: int
    resources: Resources
    selector: tuple[Constraint, ...] = ()
    node_id: bytes = b""
    """Set when the bundle is placed already (a RESCHEDULING group's survivors)."""


@dataclass(frozen=True, slots=True)
class GroupRequest:
    group_id: bytes
    strategy: int
    bundles: tuple[BundleDemand, ...]
    soft_target_node_id: bytes = b""
    allowed: frozenset[bytes] | None = None
    """Nodes of the group's virtual cluster; None = any node."""


class Outcome(enum.Enum):
    PLACED = "placed"
    NO_RESOURCES = "no_resources"
    INFEASIBLE = "infeasible"


@dataclass(frozen=True, slots=True)
class Placement:
    group_id: bytes
    outcome: Outcome
    assignment: Mapping[int, bytes] = field(default_factory=dict)
    """Bundle index -> node id, for the bundles that were unplaced."""
    reason: str = ""


def place_groups(groups: Sequence[GroupRequest], nodes: Sequence[NodeView]) -> list[Placement]:
    """Place ``groups`` in order; each placed group's bundles are taken from availability."""
    free = {n.node_id: dict(n.available) for n in nodes}
    out: list[Placement] = []
    for group in groups:
        result = place_group(group, nodes, free)
        if result.outcome is Outcome.PLACED:
            by_index = {b.index: b for b in group.bundles}
            for index, node_id in result.assignment.items():
                _take(free[node_id], by_index[index].resources)
        out.append(result)
    return out


def place_group(
    group: GroupRequest, nodes: Sequence[NodeView], free: Mapping[bytes, Mapping[str, float]]
) -> Placement:
    """One group against ``free`` (not changed); see the module docstring."""
    candidates = [n for n in nodes if (group.allowed is None or n.node_id in group.allowed)]
    pools = {n.node_id: free.get(n.node_id, n.available) for n in candidates}
    assignment, why = _solve(group, candidates, pools)
    if assignment is not None:
        return Placement(group.group_id, Outcome.PLACED, assignment)
    empty = {n.node_id: n.total for n in candidates}
    if _solve(group, candidates, empty)[0] is None:
        return Placement(group.group_id, Outcome.INFEASIBLE, reason=why)
    return Placement(group.group_id, Outcome.NO_RESOURCES, reason=why)


# -- strategies -------------------------------------------------------------------------


def _solve(
    group: GroupRequest, nodes: list[NodeView], pools: Mapping[bytes, Mapping[str, float]]
) -> tuple[dict[int, bytes] | None, str]:
    todo = sorted((b for b in group.bundles if not b.node_id), key=_size_key)
    if not todo:
        return {}, ""
    placed_on = {b.node_id for b in group.bundles if b.node_id}
    work = {n.node_id: dict(pools[n.node_id]) for n in nodes}
    if group.strategy == STRICT_PACK:
        return _strict_pack(group, todo, nodes, work, placed_on)
    if group.strategy == STRICT_SPREAD:
        return _spread(todo, nodes, work, placed_on, strict=True)
    if group.strategy == SPREAD:
        return _spread(todo, nodes, work, placed_on, strict=False)
    return _pack(todo, nodes, work)


def _pack(
    todo: list[BundleDemand], nodes: list[NodeView], work: dict[bytes, dict[str, float]]
) -> tuple[dict[int, bytes] | None, str]:
    out: dict[int, bytes] = {}
    remaining = list(todo)
    while remaining:
        best: tuple[int, float, int, bytes, list[BundleDemand]] | None = None
        for pos, node in enumerate(nodes):
            pool = dict(work[node.node_id])
            took = []
            for bundle in remaining:
                if matches(bundle.selector, node.labels) and _fits(bundle.resources, pool):
                    _take(pool, bundle.resources)
                    took.append(bundle)
            if not took:
                continue
            key = (-len(took), _leftover(node, work[node.node_id], _sum(took)), pos)
            if best is None or key < best[:3]:
                best = (*key, node.node_id, took)
        if best is None:
            b = remaining[0]
            return None, f"PACK: bundle {b.index} {_fmt(b.resources)} fits no node"
        node_id, took = best[3], best[4]
        for bundle in took:
            out[bundle.index] = node_id
            _take(work[node_id], bundle.resources)
            remaining.remove(bundle)
    return out, ""


def _spread(
    todo: list[BundleDemand],
    nodes: list[NodeView],
    work: dict[bytes, dict[str, float]],
    placed_on: set[bytes],
    *,
    strict: bool,
) -> tuple[dict[int, bytes] | None, str]:
    out: dict[int, bytes] = {}
    used = set(placed_on)
    name = "STRICT_SPREAD" if strict else "SPREAD"
    for bundle in todo:
        fitting = [
            (pos, n)
            for pos, n in enumerate(nodes)
            if matches(bundle.selector, n.labels) and _fits(bundle.resources, work[n.node_id])
        ]
        fresh = [(pos, n) for pos, n in fitting if n.node_id not in used]
        choice = fresh or ([] if strict else fitting)
        if not choice:
            return None, (
                f"{name}: bundle {bundle.index} {_fmt(bundle.resources)} fits no node "
                f"not already used by the group ({len(used)} used)"
            )
        _, node = min(
            choice, key=lambda pn: (_leftover(pn[1], work[pn[1].node_id], bundle.resources), pn[0])
        )
        out[bundle.index] = node.node_id
        used.add(node.node_id)
        _take(work[node.node_id], bundle.resources)
    return out, ""


def _strict_pack(
    group: GroupRequest,
    todo: list[BundleDemand],
    nodes: list[NodeView],
    work: dict[bytes, dict[str, float]],
    placed_on: set[bytes],
) -> tuple[dict[int, bytes] | None, str]:
    total = _sum(todo)
    selector = tuple(c for b in todo for c in b.selector)
    ok = [
        (pos, n)
        for pos, n in enumerate(nodes)
        if matches(selector, n.labels) and _fits(total, work[n.node_id])
    ]
    if placed_on:
        ok = [(pos, n) for pos, n in ok if n.node_id in placed_on]
    if not ok:
        where = "the node of its placed bundles" if placed_on else "any node"
        return None, f"STRICT_PACK: the sum {_fmt(total)} of its bundles fits not on {where}"
    target = [(pos, n) for pos, n in ok if n.node_id == group.soft_target_node_id]
    _, node = min(
        target or ok, key=lambda pn: (_leftover(pn[1], work[pn[1].node_id], total), pn[0])
    )
    return {b.index: node.node_id for b in todo}, ""


# -- arithmetic ---------------------------------------------------------------------------


def _fits(shape: Resources, pool: Mapping[str, float]) -> bool:
    return all(
        pool.get(name, 0.0) + EPSILON >= amount for name, amount in shape.items() if amount > 0
    )


def _take(pool: dict[str, float], shape: Resources) -> None:
    for name, amount in shape.items():
        if amount > 0:
            pool[name] = pool.get(name, 0.0) - amount


def _sum(bundles: Iterable[BundleDemand]) -> dict[str, float]:
    out: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.resources.items():
            out[name] = out.get(name, 0.0) + amount
    return out


def _leftover(node: NodeView, pool: Mapping[str, float], shape: Resources) -> float:
    """Best fit: the share of the demanded resources left on the node afterwards (lower
    is tighter)."""
    score = 0.0
    for name, amount in shape.items():
        if amount > 0:
            total = node.total.get(name, 0.0)
            score += (pool.get(name, 0.0) - amount) / total if total > 0 else 0.0
    return score


def _size_key(bundle: BundleDemand) -> tuple[float, float, int]:
    """Largest first: scarce GPUs, then the sum of the other amounts; index breaks ties."""
    gpu = bundle.resources.get("GPU", 0.0)
    rest = sum(v for k, v in bundle.resources.items() if k != "GPU")
    return (-gpu, -rest, bundle.index)


def _fmt(shape: Resources) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(shape.items())) + "}"
