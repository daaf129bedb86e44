"""Node limits, in Ray's order: outdated nodes, ``min_workers``, ``max_workers`` per type,
``max_num_nodes`` (steps of a round, :mod:`.round_state`)."""

from __future__ import annotations

from collections import defaultdict

from gcs.policy.autoscaling.scheduler.nodes import NodeStatus, WorkNode, from_type
from gcs.policy.autoscaling.scheduler.round_state import Round
from gcs.policy.autoscaling.scheduler.termination import is_leaving, mark, select_excess
from gcs.policy.autoscaling.scheduler.types import Decision, NodeKind, TerminationCause

__all__ = [
    "enforce_max_global",
    "enforce_max_per_type",
    "enforce_min_workers",
    "terminate_outdated",
]


def terminate_outdated(r: Round) -> None:
    if r.cfg.disable_launch_config_check:
        return
    for n in r.nodes:
        if n.status is not NodeStatus.SCHEDULABLE:
            continue
        cfg = r.cfg.node_types.get(n.node_type)
        if cfg is None:
            why = f"node type {n.node_type!r} is no longer configured"
        elif cfg.launch_config_hash and cfg.launch_config_hash != n.launch_config_hash:
            old = n.launch_config_hash or "-"
            why = f"launch config changed ({old} != {cfg.launch_config_hash})"
        else:
            continue
        if n.kind is NodeKind.HEAD:
            r.reasons.append(
                Decision("keep", n.instance_id, f"head is outdated ({why}) but never terminated")
            )
            continue
        mark(n, TerminationCause.OUTDATED, why)


def enforce_min_workers(r: Round) -> None:
    count: dict[str, int] = defaultdict(int)
    for n in r.nodes:
        if n.status is not NodeStatus.TO_TERMINATE:
            count[n.node_type] += 1
    new: list[WorkNode] = []
    for name, cfg in r.cfg.node_types.items():
        missing = cfg.min_workers - count[name]
        if missing > 0:
            new.extend(from_type(cfg) for _ in range(missing))  # distinct nodes, not aliases
            r.reasons.append(
                Decision(
                    "launch",
                    name,
                    f"launch {missing} x {name}: min_workers of {name} is "
                    f"{cfg.min_workers}, have {count[name]}",
                )
            )
    r.nodes = new + r.nodes


def enforce_max_per_type(r: Round) -> None:
    """Terminate a type's nodes beyond its max_workers.

    The surplus is over the nodes that stay: a node already leaving (``is_leaving``)
    neither counts toward it nor is chosen again.  Ray 2.60 keeps the same nodes by
    accident (its leaving nodes have no Ray node id, so they sort first and are chosen
    again, a no-op); ours carry their Ray node id and sort last, so counting them
    terminated as many running nodes more (10 running + 2 leaving, max 10: 8 left)."""
    terminating = [n for n in r.nodes if n.status is NodeStatus.TO_TERMINATE]
    by_type: dict[str, list[WorkNode]] = {}
    for n in r.nodes:
        if n.status is not NodeStatus.TO_TERMINATE:
            by_type.setdefault(n.node_type, []).append(n)
    for name, group in by_type.items():
        cfg = r.cfg.node_types.get(name)
        if cfg is None:
            continue  # Ray raises KeyError here; an unknown type has no per-type cap
        if len(group) <= cfg.max_workers:
            continue  # the common case, without looking at each node
        staying = [n for n in group if not is_leaving(n)]
        excess = len(staying) - cfg.max_workers
        if excess <= 0:
            continue
        leaving = [n for n in group if is_leaving(n)]
        why = f"{len(staying)} nodes of {name} > max_workers {cfg.max_workers}"
        gone, kept = select_excess(
            staying,
            excess,
            TerminationCause.MAX_NUM_NODE_PER_TYPE,
            why + _also_leaving(len(leaving)),
            lambda _n: False,
        )
        by_type[name] = kept + leaving
        terminating.extend(gone)
        _note_unlaunched(r, gone, f"max_workers of {name} is {cfg.max_workers}")
    r.nodes = terminating + [n for g in by_type.values() for n in g]


def enforce_max_global(r: Round) -> None:
    """Terminate nodes beyond max_num_nodes; as per type, the surplus is over the nodes
    that stay (the head counts and is never chosen; a leaving node neither)."""
    cap = r.cfg.max_num_nodes
    terminating = [n for n in r.nodes if n.status is NodeStatus.TO_TERMINATE]
    alive = [n for n in r.nodes if n.status is not NodeStatus.TO_TERMINATE]
    if not cap or len(alive) <= cap:
        return  # the common case, without looking at each node again
    staying = [n for n in alive if not is_leaving(n)]
    if len(staying) <= cap:
        return
    leaving = [n for n in alive if is_leaving(n)]
    gone, kept = select_excess(
        staying,
        len(staying) - cap,
        TerminationCause.MAX_NUM_NODES,
        f"{len(staying)} nodes > max_num_nodes {cap}" + _also_leaving(len(leaving)),
        lambda _n: False,
    )
    _note_unlaunched(r, gone, f"max_num_nodes is {cap}")
    r.nodes = terminating + gone + kept + leaving


def _note_unlaunched(r: Round, gone: list[WorkNode], why: str) -> None:
    per: dict[str, int] = defaultdict(int)
    for n in gone:
        if n.instance is None:
            per[n.node_type] += 1
    for t, c in per.items():
        r.reasons.append(Decision("skip", t, f"not launching {c} x {t} for min_workers: {why}"))


def _also_leaving(count: int) -> str:
    return f" (and {count} already stopping)" if count else ""
