"""Bundle placement: which node each bundle of a placement group goes to.  Pure.

Values in, values out: nodes (available and total resources, labels) and groups in, one
:class:`Placement` per group out.  No clock, no I/O; order is total (nodes in the order
given, bundles largest first then by index), so every run gives the same answer.

Strategies, with Ray 2.60's soft / strict meaning:

* ``PACK`` (soft): as few nodes as possible - each round the node that takes the most of
  the remaining bundles wins (best fit breaks ties); spills over to more nodes if needed.
* ``SPREAD`` (soft): each bundle on a node no other bundle of the group uses, when one
  fits; otherwise on the node that fits and holds the fewest of the group's bundles;
  among those, Ray's choice: the node left with the largest share of the demanded
  resources free (``LeastResourceScorer``).
* ``STRICT_PACK``: all bundles on one node (the sum must fit): Ray's choice, the node left
  with the largest share of the demanded resources free (``LeastResourceScorer``);
  ``soft_target_node_id`` is preferred when it fits; bundles being rescheduled must join
  the node of the placed ones.
* ``STRICT_SPREAD``: every bundle on its own node, never a node holding another bundle of
  the group (placed bundles included, so a rescheduled bundle avoids the survivors); the
  least loaded such node, as for ``SPREAD``.

A bundle with a label selector only goes to nodes whose labels match it (hard, all
strategies).  A group restricted to a virtual cluster (``allowed``) only sees its nodes.

Outcomes: ``PLACED`` (every unplaced bundle has a node), ``NO_RESOURCES`` (it would fit the
nodes' totals: retry when resources free up) or ``INFEASIBLE`` (it cannot fit even on empty
nodes of the current cluster: wait for new nodes).  Successive groups of one call see the
resources the earlier ones took.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from gcs.base.labels import selector_proto
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
    static_key: tuple[object, ...] = field(init=False, repr=False, compare=False)
    """(sorted totals, sorted labels): the part of a node's class that never changes."""
    available_key: tuple[object, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # computed once per view; callers that keep views across passes pay it once
        static = (tuple(sorted(self.total.items())), tuple(sorted(self.labels.items())))
        object.__setattr__(self, "static_key", static)
        object.__setattr__(self, "available_key", tuple(sorted(self.available.items())))


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
    """Place ``groups`` in order; each placed group's bundles are taken from availability.

    Cost: nodes are grouped into classes of identical (free, total, labels) - in a large
    cluster most nodes are alike - and a choice looks at one node per class (the first in
    order, so the answer equals a node-by-node search) plus the nodes this group touched;
    a group of B bundles costs about B x classes, not B x nodes.
    """
    live = _Classes(nodes, range(len(nodes)), use_total=False)
    empty: _Classes | None = None
    out: list[Placement] = []
    for group in groups:
        classes = live if group.allowed is None else live.subset(group.allowed)
        assignment, why = _solve(group, nodes, classes)
        if assignment is not None:
            by_index = {b.index: b for b in group.bundles}
            for index, pos in assignment.items():
                live.take(pos, by_index[index].resources)
            placed = {i: nodes[pos].node_id for i, pos in assignment.items()}
            out.append(Placement(group.group_id, Outcome.PLACED, placed))
            continue
        if empty is None:
            empty = _Classes(nodes, range(len(nodes)), use_total=True)
        scope = empty if group.allowed is None else empty.subset(group.allowed)
        never = _solve(group, nodes, scope)[0] is None
        outcome = Outcome.INFEASIBLE if never else Outcome.NO_RESOURCES
        out.append(Placement(group.group_id, outcome, reason=why))
    return out


class _Classes:
    """Node positions grouped by identical (free, total, labels); ``free`` per position."""

    def __init__(
        self,
        nodes: Sequence[NodeView],
        positions: Iterable[int],
        *,
        use_total: bool,
        free: Mapping[int, Resources] | None = None,
    ) -> None:
        """Positions in ascending order; free = each node's available (or total) unless
        ``free`` gives it (never changed in place: copied on the first take)."""
        self.nodes = nodes
        self.free: dict[int, Resources] = {}
        self.members: dict[tuple[object, ...], list[int]] = {}
        self._key: dict[int, tuple[object, ...]] = {}
        for pos in positions:
            node = nodes[pos]
            if free is not None:
                self.free[pos] = free[pos]
                key = (tuple(sorted(free[pos].items())), *node.static_key)
            elif use_total:
                self.free[pos] = node.total
                key = (node.static_key[0], *node.static_key)
            else:
                self.free[pos] = node.available
                key = (node.available_key, *node.static_key)
            self._key[pos] = key
            self.members.setdefault(key, []).append(pos)

    def subset(self, allowed: frozenset[bytes]) -> _Classes:
        keep = [p for p in self.free if self.nodes[p].node_id in allowed]
        return _Classes(self.nodes, sorted(keep), use_total=False, free=self.free)

    def positions_of(self, node_ids: AbstractSet[bytes]) -> set[int]:
        return {p for p in self.free if self.nodes[p].node_id in node_ids}

    def take(self, pos: int, shape: Resources) -> None:
        members = self.members[self._key[pos]]
        members.remove(pos)
        if not members:
            del self.members[self._key[pos]]
        pool = dict(self.free[pos])
        _take(pool, shape)
        self.free[pos] = pool
        key = (tuple(sorted(pool.items())), *self.nodes[pos].static_key)
        self._key[pos] = key
        bisect.insort(self.members.setdefault(key, []), pos)


class _Work:
    """One solve's view: the classes plus copies of the nodes it took from."""

    def __init__(self, classes: _Classes) -> None:
        self._classes = classes
        self.touched: dict[int, dict[str, float]] = {}

    def free(self, pos: int) -> Mapping[str, float]:
        touched = self.touched.get(pos)
        return touched if touched is not None else self._classes.free[pos]

    def candidates(self, skip: AbstractSet[int] = frozenset()) -> list[int]:
        """Touched nodes, then the first untouched node of each class (``skip`` left out),
        in position order."""
        out = [pos for pos in self.touched if pos not in skip]
        for members in self._classes.members.values():
            for pos in members:
                if pos not in self.touched and pos not in skip:
                    out.append(pos)
                    break
        out.sort()
        return out

    def take(self, pos: int, shape: Resources) -> None:
        pool = self.touched.get(pos)
        if pool is None:
            pool = self.touched[pos] = dict(self._classes.free[pos])
        _take(pool, shape)


# -- strategies -------------------------------------------------------------------------


def _solve(
    group: GroupRequest, nodes: Sequence[NodeView], classes: _Classes
) -> tuple[dict[int, int] | None, str]:
    """Bundle index -> node position for the unplaced bundles, or (None, why)."""
    todo = sorted((b for b in group.bundles if not b.node_id), key=_size_key)
    if not todo:
        return {}, ""
    placed_on = {b.node_id for b in group.bundles if b.node_id}
    placed_pos = classes.positions_of(placed_on) if placed_on else set()
    work = _Work(classes)
    if group.strategy == STRICT_PACK:
        target = (
            classes.positions_of({group.soft_target_node_id})
            if group.soft_target_node_id
            else set()
        )
        return _strict_pack(todo, nodes, work, bool(placed_on), placed_pos, target)
    if group.strategy == STRICT_SPREAD:
        return _spread(todo, nodes, work, placed_pos, strict=True)
    if group.strategy == SPREAD:
        return _spread(todo, nodes, work, placed_pos, strict=False)
    return _pack(todo, nodes, work)


def _pack(
    todo: list[BundleDemand], nodes: Sequence[NodeView], work: _Work
) -> tuple[dict[int, int] | None, str]:
    out: dict[int, int] = {}
    remaining = list(todo)
    while remaining:
        best: tuple[int, float, int, list[BundleDemand]] | None = None
        for pos in work.candidates():
            node = nodes[pos]
            pool = dict(work.free(pos))
            took = []
            for bundle in remaining:
                if matches(bundle.selector, node.labels) and _fits(bundle.resources, pool):
                    _take(pool, bundle.resources)
                    took.append(bundle)
            if not took:
                continue
            key = (-len(took), _leftover(node, work.free(pos), _sum(took)), pos)
            if best is None or key < best[:3]:
                best = (*key, took)
        if best is None:
            b = remaining[0]
            return None, f"PACK: bundle {b.index} {_fmt(b.resources)} fits no node"
        pos, took = best[2], best[3]
        for bundle in took:
            out[bundle.index] = pos
            work.take(pos, bundle.resources)
            remaining.remove(bundle)
    return out, ""


def _spread(
    todo: list[BundleDemand],
    nodes: Sequence[NodeView],
    work: _Work,
    placed_pos: set[int],
    *,
    strict: bool,
) -> tuple[dict[int, int] | None, str]:
    out: dict[int, int] = {}
    used = set(placed_pos)
    count = dict.fromkeys(placed_pos, 1)
    name = "STRICT_SPREAD" if strict else "SPREAD"
    for bundle in todo:
        choice = _fitting(bundle, nodes, work, work.candidates(used))
        if not choice and not strict:
            choice = _fitting(bundle, nodes, work, work.candidates())
        if not choice:
            return None, (
                f"{name}: bundle {bundle.index} {_fmt(bundle.resources)} fits no node "
                f"not already used by the group ({len(used)} used)"
            )
        # Ray's choice (``LeastResourceScorer``): the node left with the largest share of
        # the demanded resources free, so groups spread over the cluster rather than pile
        # onto the same nodes (each bundle adds names to its node's resource view)
        pos = min(
            choice,
            key=lambda p: (
                count.get(p, 0),
                -_least_loaded(work.free(p), bundle.resources),
                p,
            ),
        )
        out[bundle.index] = pos
        used.add(pos)
        count[pos] = count.get(pos, 0) + 1
        work.take(pos, bundle.resources)
    return out, ""


def _fitting(
    bundle: BundleDemand, nodes: Sequence[NodeView], work: _Work, candidates: list[int]
) -> list[int]:
    return [
        pos
        for pos in candidates
        if matches(bundle.selector, nodes[pos].labels) and _fits(bundle.resources, work.free(pos))
    ]


def _strict_pack(
    todo: list[BundleDemand],
    nodes: Sequence[NodeView],
    work: _Work,
    placed_on: bool,
    placed_pos: set[int],
    target: set[int],
) -> tuple[dict[int, int] | None, str]:
    total = _sum(todo)
    selector = tuple(c for b in todo for c in b.selector)
    candidates = sorted(placed_pos) if placed_on else work.candidates()
    ok = [
        pos
        for pos in dict.fromkeys([*sorted(target), *candidates])
        if matches(selector, nodes[pos].labels) and _fits(total, work.free(pos))
    ]
    if not ok:
        where = "the node of its placed bundles" if placed_on else "any node"
        return None, f"STRICT_PACK: the sum {_fmt(total)} of its bundles fits not on {where}"
    preferred = [p for p in ok if p in target and (not placed_on or p in placed_pos)]
    pos = max(preferred or ok, key=lambda p: (_least_loaded(work.free(p), total), -p))
    return {b.index: pos for b in todo}, ""


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


def _least_loaded(pool: Mapping[str, float], shape: Resources) -> float:
    """Ray's bundle scorer (``LeastResourceScorer``): the share of each demanded resource
    still available on the node afterwards, summed (higher wins: the emptiest node)."""
    score = 0.0
    for name, amount in shape.items():
        available = pool.get(name, 0.0)
        if amount > 0 and available > 0:
            score += (available - amount) / available
    return score


def _size_key(bundle: BundleDemand) -> tuple[float, float, int]:
    """Largest first: scarce GPUs, then the sum of the other amounts; index breaks ties."""
    gpu = bundle.resources.get("GPU", 0.0)
    rest = sum(v for k, v in bundle.resources.items() if k != "GPU")
    return (-gpu, -rest, bundle.index)


def _fmt(shape: Resources) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(shape.items())) + "}"
