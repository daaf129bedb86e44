"""Where an actor's creation task should lease its worker: a pure function of values.

:func:`choose_node` takes the actor's demand and a snapshot of candidate nodes and returns a
:class:`Placement`: a node id, or none with the reason (wait and retry), or ``fatal`` (the
actor can never be placed, e.g. a hard node affinity to a dead node).  No I/O, no clock.

Order (total, documented so tests are exact):

1. Candidates: alive, not draining, inside the job's virtual cluster (when it has one), not
   excluded (raylets that just rejected or failed this attempt), with labels matching the
   actor's label selector (every constraint: ``in`` needs the node's value among the
   listed ones, ``!in`` a value not among them or no such label).  None match: wait.
2. Node affinity: the target if it is a candidate; otherwise soft affinity falls through to
   the default policy and hard affinity is fatal if the node is gone, else waits.
3. Placement-group bundle: a node holding the bundle (any bundle when the index is -1); the
   raylet there checks the bundle's resources, so no fit check here; none placed yet: wait.
4. Resources (``required_placement_resources``, else ``required_resources``): nodes whose
   totals fit are *feasible*, those whose available resources fit are *ready*.  None
   feasible: queue at the owner's node (else the lowest id) so the demand is reported.
   SPREAD picks the ready (else feasible) node hosting the fewest of our actors, then by
   node id.  DEFAULT picks the owner's node when ready; else the ready node with the
   lowest utilisation after placing (the max over the demanded resources of used / total),
   then by node id; else the feasible node with the most of the demanded resources
   available, then by node id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gcs.proto import common_pb2

__all__ = ["Candidate", "Demand", "Placement", "choose_node", "matches_labels"]


@dataclass(frozen=True, slots=True)
class Candidate:
    node_id: bytes
    total: Mapping[str, float]
    available: Mapping[str, float]
    draining: bool = False
    bundles: frozenset[tuple[bytes, int]] = frozenset()
    """(placement group id, bundle index) committed on this node."""
    actors: int = 0
    """Actors we placed on it (SPREAD balances these)."""
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Demand:
    resources: Mapping[str, float]
    strategy: common_pb2.SchedulingStrategy
    owner_node_id: bytes = b""
    allowed_nodes: frozenset[bytes] | None = None
    """The job's virtual cluster members (None: no restriction)."""
    excluded: frozenset[bytes] = field(default_factory=frozenset)
    label_selector: common_pb2.LabelSelector | None = None
    """The actor's ``label_selector`` (Ray's job supervisor pins itself to the head node
    with ``ray.io/node-id``)."""


@dataclass(frozen=True, slots=True)
class Placement:
    node_id: bytes | None
    reason: str = ""
    fatal: bool = False
    queue_at: bytes | None = None
    """No node fits: queue the lease at this raylet anyway (the owner's node, else the
    lowest id), which reports it as infeasible demand so an autoscaler adds a node, as
    Ray's raylet-based actor scheduling does."""


def _fits(need: Mapping[str, float], have: Mapping[str, float]) -> bool:
    return all(amount <= have.get(name, 0.0) + 1e-9 for name, amount in need.items() if amount > 0)


def _utilisation(need: Mapping[str, float], node: Candidate) -> float:
    worst = 0.0
    for name, amount in need.items():
        total = node.total.get(name, 0.0)
        if total > 0:
            used = total - node.available.get(name, 0.0) + amount
            worst = max(worst, used / total)
    return worst


def matches_labels(selector: common_pb2.LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Ray's label selector semantics: every constraint holds (``in`` / ``!in``)."""
    if selector is None:
        return True
    for constraint in selector.label_constraints:
        value = labels.get(constraint.label_key)
        listed = value is not None and value in constraint.label_values
        if constraint.operator == common_pb2.LABEL_OPERATOR_NOT_IN:
            if listed:
                return False
        elif not listed:  # IN (and the unspecified operator, read as IN)
            return False
    return True


def choose_node(demand: Demand, nodes: Iterable[Candidate]) -> Placement:
    every = {n.node_id: n for n in nodes}
    candidates = [
        n
        for n in every.values()
        if not n.draining
        and n.node_id not in demand.excluded
        and (demand.allowed_nodes is None or n.node_id in demand.allowed_nodes)
    ]
    candidates.sort(key=lambda n: n.node_id)
    if demand.label_selector is not None and demand.label_selector.label_constraints:
        candidates = [n for n in candidates if matches_labels(demand.label_selector, n.labels)]
        if not candidates:
            return Placement(None, "no alive node matches the label selector")
    strategy = demand.strategy
    kind = strategy.WhichOneof("scheduling_strategy")
    if kind == "node_affinity_scheduling_strategy":
        affinity = strategy.node_affinity_scheduling_strategy
        target = next((n for n in candidates if n.node_id == affinity.node_id), None)
        if target is not None:
            return Placement(target.node_id)
        if not affinity.soft:
            if affinity.node_id not in every:
                return Placement(
                    None,
                    f"node affinity: node {affinity.node_id.hex()} is not alive",
                    fatal=True,
                )
            return Placement(None, f"node affinity: node {affinity.node_id.hex()} is unavailable")
    elif kind == "placement_group_scheduling_strategy":
        pg = strategy.placement_group_scheduling_strategy
        index = pg.placement_group_bundle_index
        for node in candidates:
            if any(
                pg_id == pg.placement_group_id and (index < 0 or i == index)
                for pg_id, i in node.bundles
            ):
                return Placement(node.node_id)
        return Placement(
            None, f"placement group {pg.placement_group_id.hex()} bundle {index} is not placed"
        )
    need = demand.resources
    feasible = [n for n in candidates if _fits(need, n.total)]
    if not feasible:
        shape = ", ".join(f"{k}: {v:g}" for k, v in sorted(need.items())) or "no resources"
        queue = next((n for n in candidates if n.node_id == demand.owner_node_id), None)
        if queue is None and candidates:
            queue = candidates[0]
        return Placement(
            None,
            f"no node can fit {{{shape}}}",
            queue_at=queue.node_id if queue is not None else None,
        )
    ready = [n for n in feasible if _fits(need, n.available)]
    if kind == "spread_scheduling_strategy":
        pool = ready or feasible
        return Placement(min(pool, key=lambda n: (n.actors, n.node_id)).node_id)
    if ready:
        owner = next((n for n in ready if n.node_id == demand.owner_node_id), None)
        if owner is not None:
            return Placement(owner.node_id)
        return Placement(min(ready, key=lambda n: (_utilisation(need, n), n.node_id)).node_id)
    best = max(
        feasible,
        key=lambda n: (sum(n.available.get(k, 0.0) for k in need), _neg_id(n.node_id)),
    )
    return Placement(best.node_id)


def _neg_id(node_id: bytes) -> tuple[int, ...]:
    """Sort key making ``max`` prefer the lowest node id on ties."""
    return tuple(-b for b in node_id)
