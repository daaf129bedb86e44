"""The bin packer: Ray 2.60's ``_try_schedule`` / ``_sched_best_node``, near-linear.

Ray re-packs every candidate node with every remaining request in every round. We make
the same choices with less work:

* demand stays grouped; a candidate takes ``k`` copies of a group at once (``fit_count``);
* candidates that would score identically (same type, same relevant resources, labels
  and placement history) form one class and only its first member is evaluated: the
  first member is what Ray's stable sort would pick among equals anyway;
* a class that fits nothing is dropped (requests only shrink, so it never fits later);
* only the winning node is copied (copy on write), so a failed gang costs no copies.

KubeRay in-place pod resize (IPPR) follows Ray's three phases: a pod with a resize in
flight counts at its *desired* size; after existing nodes are filled, resizable pods are
offered at their IPPR max and each picked pod gets a resize to that max queued; new
nodes of an IPPR-enabled type count at max(IPPR max, type resources).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gcs.policy.autoscaling.scheduler.nodes import NodeStatus, Source, WorkNode, from_type
from gcs.policy.autoscaling.scheduler.resources import (
    fit_count,
    fits_shape,
    label_score,
    memory_text,
    positive_shape,
    shape_text,
    subtract,
)
from gcs.policy.autoscaling.scheduler.scoring import Score, compute_score
from gcs.policy.autoscaling.scheduler.types import NodeTypeConfig, ResourceDemand

_SOURCE_WORDS = {Source.DEMAND: "pending", Source.CONSTRAINT: "request_resources"}


@dataclass(frozen=True)
class PackContext:
    configs: Mapping[str, NodeTypeConfig]
    max_num_nodes: int | None
    cloud_availability: Mapping[str, float]
    recoverable_availability: Mapping[str, float]
    conserve_gpu: bool = True
    #: Node types not to launch this round (unavailable-type cache).
    blocked_types: frozenset[str] = frozenset()
    #: Ray 2.60 lets nodes already marked TO_TERMINATE absorb demand; we do not.
    skip_terminating: bool = True


@dataclass
class LaunchNote:
    """Why a new node of ``node_type`` was picked (for the reasons list)."""

    node_type: str
    placed: list[tuple[ResourceDemand, int]]
    score: Score
    runner_up: tuple[str, Score] | None


@dataclass
class PackResult:
    nodes: list[WorkNode]
    leftover: list[tuple[ResourceDemand, int]]
    launches: list[LaunchNote] = field(default_factory=list)


@dataclass
class _Eval:
    placements: list[tuple[int, int]]
    avail: dict[str, float]
    labels: dict[str, str]
    score: Score


class _Demand:
    """The remaining requests of one ``_try_schedule`` call, in Ray's sorted order."""

    def __init__(self, groups: Sequence[tuple[ResourceDemand, int]]) -> None:
        from gcs.policy.autoscaling.scheduler.resources import demand_sort_key

        order = sorted(
            range(len(groups)), key=lambda i: demand_sort_key(groups[i][0]), reverse=True
        )
        self.demands = [groups[i][0] for i in order]
        self.counts = [groups[i][1] for i in order]
        self.shapes = list({positive_shape(d.resources): None for d in self.demands})
        names = {"GPU"}
        keys: set[str] = set()
        for d in self.demands:
            names.update(d.resources)
            for sel in d.selectors:
                keys.update(c.key for c in sel)
            if d.anti_affinity:
                keys.add(d.anti_affinity[0])
        self.names = frozenset(names)
        self.label_keys = frozenset(keys)

    def remaining(self) -> int:
        return sum(self.counts)

    def leftover(self) -> list[tuple[ResourceDemand, int]]:
        return [(d, c) for d, c in zip(self.demands, self.counts, strict=True) if c > 0]


def _evaluate(node: WorkNode, dem: _Demand, source: Source, conserve_gpu: bool) -> _Eval | None:
    avail = dict(node.avail[source])
    labels = node.labels
    placements: list[tuple[int, int]] = []
    copied_labels = False
    for i, d in enumerate(dem.demands):
        rem = dem.counts[i]
        if rem <= 0:
            continue
        if d.selectors and label_score(labels, d.selectors) == 0:
            continue
        limit = rem
        if d.anti_affinity is not None:
            name, value = d.anti_affinity
            if labels.get(name) == value:
                continue
            limit = 1
        k = fit_count(avail, d.resources, limit)
        if k <= 0:
            continue
        subtract(avail, d.resources, k)
        placements.append((i, k))
        if d.anti_affinity is not None:
            if not copied_labels:
                labels = dict(labels)
                copied_labels = True
            labels[d.anti_affinity[0]] = d.anti_affinity[1]
    if not placements:
        return None
    placed = [d for d, _ in node.placed[source]] + [dem.demands[i] for i, _ in placements]
    score = compute_score(node.total, avail, labels, placed, conserve_gpu)
    return _Eval(placements, avail, dict(labels) if not copied_labels else labels, score)


def _apply(node: WorkNode, ev: _Eval, dem: _Demand, source: Source) -> WorkNode:
    new = node.clone()
    new.avail[source].clear()
    new.avail[source].update(ev.avail)
    new.labels = dict(ev.labels)  # an evaluation may be applied to several equal nodes
    for i, k in ev.placements:
        new.placed[source].append((dem.demands[i], k))
        dem.counts[i] -= k
    return new


def _signature(node: WorkNode, dem: _Demand, source: Source) -> tuple:
    avail = node.avail[source]
    names = dem.names
    relevant, others = [], []
    for k, v in node.total.items():
        if k in names:
            relevant.append((k, v))
        else:
            others.append((v, avail.get(k, -1.0)))
    rel_total = frozenset(relevant)
    other = tuple(sorted(others)) if others else ()
    rel_avail = frozenset([(k, v) for k, v in avail.items() if k in names])
    keys = dem.label_keys
    labels = (
        frozenset([(k, v) for k, v in node.labels.items() if k in keys])
        if keys and node.labels
        else frozenset()
    )
    base = (node.node_type, node.kind, node.priority, rel_total, other, rel_avail, labels)
    if not node.is_running:
        return base  # Ray merges identical non-running nodes regardless of history
    history = tuple(dict.fromkeys(id(d) for d, _ in node.placed[source]))
    return (*base, True, history)


def _rank(ev: _Eval, node: WorkNode, ctx: PackContext) -> tuple:
    return (
        ev.score,
        ctx.recoverable_availability.get(node.node_type, 1.0),
        node.priority,
        ctx.cloud_availability.get(node.node_type, 1.0),
    )


def _limits(dem: _Demand) -> list[int]:
    """How many copies of each group ``_evaluate`` may place on one node right now."""
    return [
        0 if c <= 0 else (1 if d.anti_affinity is not None else c)
        for d, c in zip(dem.demands, dem.counts, strict=True)
    ]


def _still_valid(ev: _Eval, then: list[int], now: list[int]) -> bool:
    """Would ``_evaluate`` place the same with the limits ``now`` as it did with ``then``?

    Each group places ``min(limit, what fits)`` on the resources the earlier groups left, so
    a placement ``k`` stays the same when its limit did not change, or when ``k`` was below
    the old limit (what fits) and is within the new one.  Groups that placed nothing still
    place nothing (limits only shrink).
    """
    for i, k in ev.placements:
        old, new = then[i], now[i]
        if new != old and not (k < old and k <= new):
            return False
    return True


def _same_state(a: WorkNode, b: WorkNode, source: Source) -> bool:
    """Everything ``_evaluate`` and ``_rank`` read of a node is equal."""
    pa, pb = a.placed[source], b.placed[source]
    return (
        a.node_type == b.node_type
        and a.priority == b.priority
        and a.total == b.total
        and a.avail[source] == b.avail[source]
        and a.labels == b.labels
        and len(pa) == len(pb)
        and all(x[0] is y[0] for x, y in zip(pa, pb, strict=True))
    )


def _pick_existing(
    candidates: list[WorkNode], dem: _Demand, source: Source, ctx: PackContext
) -> tuple[list[tuple[int, WorkNode]], list[bool]]:
    """Fill existing nodes; returns (position, modified copy) per winner and who remains.

    Each class's evaluation is kept between picks (``cache``) and reused while it provably
    has not changed: its first member has the same state as the node it was computed on and
    the requests taken since do not change what it places (:func:`_still_valid`).  Filling
    hundreds of identical new nodes then costs one evaluation, not one per node.
    """
    classes: dict[tuple, deque[int]] = {}
    for pos, node in enumerate(candidates):
        classes.setdefault(_signature(node, dem, source), deque()).append(pos)
    remaining = [True] * len(candidates)
    winners: list[tuple[int, WorkNode]] = []
    cache: dict[tuple, tuple[int, _Eval, tuple, list[int]]] = {}
    limits = _limits(dem)
    while dem.remaining() > 0 and classes:
        best = None
        dead = []
        for sig, members in classes.items():
            pos = members[0]
            hit = cache.get(sig)
            if (
                hit is not None
                and (hit[0] == pos or _same_state(candidates[hit[0]], candidates[pos], source))
                and (hit[3] is limits or _still_valid(hit[1], hit[3], limits))
            ):
                _, ev, key, _ = hit
            else:
                found = _evaluate(candidates[pos], dem, source, ctx.conserve_gpu)
                if found is None:
                    dead.append(sig)
                    continue
                ev, key = found, _rank(found, candidates[pos], ctx)
                cache[sig] = (pos, ev, key, limits)
            if best is None or key > best[0] or (key == best[0] and pos < best[1]):
                best = (key, pos, sig, ev)
        for sig in dead:
            del classes[sig]
        if best is None:
            break
        _, pos, sig, ev = best
        classes[sig].popleft()
        if not classes[sig]:
            del classes[sig]
        remaining[pos] = False
        winners.append((pos, _apply(candidates[pos], ev, dem, source)))
        limits = _limits(dem)
    return winners, remaining


def _with_resize_in_flight(node: WorkNode) -> WorkNode:
    """A pod whose resize is in flight or queued counts at its desired size (a copy)."""
    st = node.ippr
    if st is None or not st.is_in_progress():
        return node
    want = {"CPU": float(st.desired_cpu), "memory": float(st.desired_memory)}  # type: ignore[arg-type]
    if all(node.total.get(k) == v and all(k in a for a in node.avail) for k, v in want.items()):
        return node
    new = node.clone()
    new.set_totals(want)
    return new


def _resizable(node: WorkNode) -> bool:
    return (
        node.ippr is not None
        and node.ippr_spec is not None
        and node.status is not NodeStatus.TO_TERMINATE
        and node.ippr.can_resize_up(node.ippr_spec)
    )


def _resize_up(
    nodes: list[WorkNode], dem: _Demand, source: Source, ctx: PackContext
) -> list[WorkNode]:
    """Phase B: offer resizable pods at their IPPR max; queue a resize on each one picked.

    Ray's order afterwards: other nodes, picked pods in pick order, unpicked pods as
    they were (at their current size).
    """
    flags = [_resizable(n) for n in nodes]
    if not any(flags):
        return nodes
    others = [n for n, f in zip(nodes, flags, strict=True) if not f]
    originals = [n for n, f in zip(nodes, flags, strict=True) if f]
    raised = []
    for n in originals:
        st, spec = n.ippr, n.ippr_spec
        r = n.clone()
        r.set_totals({"CPU": float(st.max_cpu(spec)), "memory": float(st.max_memory(spec))})  # type: ignore[union-attr,arg-type]
        raised.append(r)
    winners, remaining = (
        _pick_existing(raised, dem, source, ctx) if dem.remaining() else ([], [True] * len(raised))
    )
    for pos, w in winners:
        _queue_resize(w, len(originals[pos].placed[source]), source)
    return (
        others
        + [w for _, w in winners]
        + [n for n, keep in zip(originals, remaining, strict=True) if keep]
    )


def _queue_resize(node: WorkNode, placed_before: int, source: Source) -> None:
    """Ray's ``queue_resize_request(max_cpu, max_memory)`` with the reason for it."""
    st, spec = node.ippr, node.ippr_spec
    assert st is not None and spec is not None
    cpu, mem = st.max_cpu(spec), st.max_memory(spec)
    if cpu == st.desired_cpu and mem == st.desired_memory:
        return
    node.ippr = replace(
        st, desired_cpu=cpu, desired_memory=mem, resizing_at=None, k8s_resize_status="new"
    )
    took: dict[str, int] = {}
    for d, k in node.placed[source][placed_before:]:
        took[shape_text(d.resources)] = took.get(shape_text(d.resources), 0) + k
    what = ", ".join(f"{k} x {s}" for s, k in took.items())
    suggested = st.suggested_max_cpu is not None or st.suggested_max_memory is not None
    cap = "suggested caps from a deferred/infeasible resize" if suggested else "IPPR max"
    node.resize_reason = (
        f"resize in place from CPU {st.current_cpu:g}, memory {memory_text(st.current_memory)} "
        f"to CPU {cpu:g}, memory {memory_text(mem)} ({cap}): {what} "
        f"{_SOURCE_WORDS[source]} requests fit no node at its current size"
    )


def template(cfg: NodeTypeConfig) -> WorkNode:
    """A node to launch; an IPPR-enabled type counts at max(IPPR max, its resources)."""
    node = from_type(cfg)
    if cfg.ippr is not None:
        node.set_totals(
            {
                "CPU": float(max(cfg.ippr.max_cpu, node.total.get("CPU", 0.0))),
                "memory": float(max(cfg.ippr.max_memory, node.total.get("memory", 0.0))),
            }
        )
    return node


def _pick_new(
    nodes: list[WorkNode], dem: _Demand, source: Source, ctx: PackContext
) -> list[LaunchNote]:
    """Phase C: launch new nodes, one round per node, Ray's type pool order."""
    available: dict[str, int] = {}
    count: dict[str, int] = {}
    for n in nodes:
        count[n.node_type] = count.get(n.node_type, 0) + 1
    for name, cfg in ctx.configs.items():
        available[name] = cfg.max_workers - count.get(name, 0)
    pool = [t for t, a in available.items() if a > 0 and t not in ctx.blocked_types]
    notes: list[LaunchNote] = []
    # A type's template and evaluation are kept while still valid (as in _pick_existing).
    cache: dict[str, tuple[WorkNode, _Eval, tuple, list[int]]] = {}
    limits = _limits(dem)
    while dem.remaining() > 0 and pool:
        if ctx.max_num_nodes is not None and len(nodes) >= ctx.max_num_nodes:
            break
        results = []
        for idx, t in enumerate(pool):
            hit = cache.get(t)
            if hit is not None and (hit[3] is limits or _still_valid(hit[1], hit[3], limits)):
                results.append((hit[2], idx, hit[0], hit[1]))
                continue
            new = template(ctx.configs[t])
            ev = _evaluate(new, dem, source, ctx.conserve_gpu)
            if ev is not None:
                key = _rank(ev, new, ctx)
                cache[t] = (new, ev, key, limits)
                results.append((key, idx, new, ev))
        if not results:
            break
        results.sort(key=lambda r: r[0], reverse=True)
        _, idx, new, ev = results[0]
        runner = next(((r[2].node_type, r[3].score) for r in results[1:]), None)
        node = _apply(new, ev, dem, source)
        limits = _limits(dem)
        nodes.append(node)
        notes.append(
            LaunchNote(
                t := pool.pop(idx),
                [(dem.demands[i], k) for i, k in ev.placements],
                ev.score,
                runner,
            )
        )
        available[t] -= 1
        if available[t] > 0:
            pool.append(t)
    return notes


def try_schedule(
    nodes: Sequence[WorkNode],
    groups: Sequence[tuple[ResourceDemand, int]],
    source: Source,
    ctx: PackContext,
) -> PackResult:
    """Place grouped demand on ``nodes`` then on new nodes. Inputs are not modified."""
    dem = _Demand([(d, c) for d, c in groups if c > 0])
    candidates: list[WorkNode] = []
    exhausted: list[WorkNode] = []
    held: list[WorkNode] = []
    for original in nodes:
        node = _with_resize_in_flight(original)
        if ctx.skip_terminating and node.status is NodeStatus.TO_TERMINATE:
            held.append(node)
        elif node.is_running and not any(fits_shape(node.avail[source], s) for s in dem.shapes):
            exhausted.append(node)
        else:
            candidates.append(node)
    winners, remaining = (
        _pick_existing(candidates, dem, source, ctx)
        if dem.remaining()
        else ([], [True] * len(candidates))
    )
    out = (
        [w for _, w in winners]
        + [n for n, keep in zip(candidates, remaining, strict=True) if keep]
        + exhausted
    )
    out = _resize_up(out, dem, source, ctx) + held
    notes = _pick_new(out, dem, source, ctx) if dem.remaining() else []
    return PackResult(out, dem.leftover(), notes)
