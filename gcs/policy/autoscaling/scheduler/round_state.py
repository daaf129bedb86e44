"""One scheduling round's working state (private to the scheduler; made and dropped by
:func:`~gcs.policy.autoscaling.scheduler.core.schedule`).

The steps of the round (``limits``, ``gangs``, ``demand``, ``idle``, ``reply``) are
functions over this state; it holds what they share: the nodes as placed so far, the node
types held back and why, the reasons and waiting verdicts gathered, and the launch notes.
"""

from __future__ import annotations

from collections import defaultdict

from gcs.policy.autoscaling.scheduler.nodes import NodeStatus, Source, WorkNode, from_instance
from gcs.policy.autoscaling.scheduler.packing import LaunchNote, PackContext
from gcs.policy.autoscaling.scheduler.termination import mark
from gcs.policy.autoscaling.scheduler.types import (
    SCHEDULABLE_STATUSES,
    Decision,
    SchedulingInput,
    TerminationCause,
    WaitingDemand,
)

__all__ = ["Round"]


class Round:
    """State of one scheduling round."""

    def __init__(self, inp: SchedulingInput) -> None:
        self.inp = inp
        self.cfg = inp.config
        self.opts = inp.config.options
        self.reasons: list[Decision] = []
        self.notes: list[LaunchNote] = []
        self.waiting: list[WaitingDemand] = []
        self._limited_memo: tuple[list[WorkNode], dict[str, str]] | None = None
        blocked: dict[str, str] = {}
        ttl = self.opts.unavailable_type_ttl_s
        if ttl is not None:
            for f in inp.launch_failures:
                if inp.now_s - f.at_s < ttl:
                    why = f"is unavailable: a launch failed less than {ttl:g} s ago"
                    blocked[f.node_type] = why
        for node_type, why in inp.unavailable_types.items():
            blocked[node_type] = f"is unavailable ({why})"
        self.blocked_why = blocked
        self.blocked = frozenset(blocked)
        self.pack = PackContext(
            configs=self.cfg.node_types,
            max_num_nodes=self.cfg.max_num_nodes,
            cloud_availability=inp.cloud_availability,
            recoverable_availability=inp.recoverable_availability,
            conserve_gpu=self.opts.conserve_gpu_nodes,
            blocked_types=self.blocked,
        )
        self.nodes: list[WorkNode] = []
        configs = dict(self.cfg.node_types)
        for inst in inp.instances:
            if inst.status not in SCHEDULABLE_STATUSES:
                continue
            node = from_instance(inst, configs, not self.cfg.disable_launch_config_check)
            if node is None:
                continue
            if node.status is NodeStatus.TO_TERMINATE:
                mark(
                    node,
                    TerminationCause.OUTDATED,
                    f"node type {inst.node_type!r} is no longer configured",
                )
            self.nodes.append(node)
        self.last_work = dict(inp.last_work_s)
        if self.opts.own_idle_clock:
            self._apply_own_idle_clock()

    def protected(self, node: WorkNode) -> bool:
        label = self.opts.do_not_disrupt_label
        return label is not None and bool(label) and node.labels.get(label) == "true"

    def _apply_own_idle_clock(self) -> None:
        now = self.inp.now_s
        for n in self.nodes:
            if n.instance is None or not n.is_running:
                continue
            iid = n.instance_id
            busy = any(n.avail[Source.DEMAND].get(k, 0) < v for k, v in n.total.items())
            if busy:
                self.last_work[iid] = now
            elif iid not in self.last_work:
                self.last_work[iid] = now - n.idle_duration_ms / 1000
            n.idle_duration_ms = round(max(0.0, now - self.last_work[iid]) * 1000)

    def forget_limits(self) -> None:
        """Nodes of ``self.nodes`` were marked in place: count the limits again."""
        self._limited_memo = None

    def limited(self) -> dict[str, str]:
        """Node types a limit stops from launching now, with why.  Counting looks at every
        node, so it is kept until ``self.nodes`` is replaced (every placement replaces the
        list; the memo holds it, so its identity cannot be reused): many unplaced gangs
        in a row cost one count, not one each."""
        memo = self._limited_memo
        if memo is not None and memo[0] is self.nodes:
            return memo[1]
        count: dict[str, int] = defaultdict(int)
        for n in self.nodes:
            if n.status is not NodeStatus.TO_TERMINATE:
                count[n.node_type] += 1
        out = {
            name: f"is at max_workers {cfg.max_workers}"
            for name, cfg in self.cfg.node_types.items()
            if count[name] >= cfg.max_workers
        }
        self._limited_memo = (self.nodes, out)
        return out

    def excluded(self) -> dict[str, str]:
        """Node types that cannot be launched now, with why (for the reasons)."""
        return {**self.limited(), **self.blocked_why}

    def cluster_full(self) -> str | None:
        cap = self.cfg.max_num_nodes
        alive = sum(1 for n in self.nodes if n.status is not NodeStatus.TO_TERMINATE)
        if cap and alive >= cap:
            return f"is at max_workers {cap - 1} (plus the head)"
        return None
