"""The reconciler's narrator: capacity refusals and scheduling verdicts as events.

:class:`CapacityWatch` feeds the unavailable-capacity cache (:mod:`gcs.policy.autoscaling.capacity`)
from each round's launch errors and allocations, says in the event log what failed, why and
what happens next, and cancels queued launches of a type held back (so the scheduler can pick
another).  :class:`DecisionNotes` turns the scheduler's verdicts on demand it could not place
(no node type fits, a type at max_workers, the cluster cap, a type held back) into events,
once per change rather than every round.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from gcs.autoscaler.instances.model import Instance, InstanceUpdate
from gcs.autoscaler.providers.base import LaunchNodeError
from gcs.autoscaler.reconciler.events import EventLog
from gcs.policy.autoscaling.capacity import UnavailableCapacity, failure_event, released_event
from gcs.policy.autoscaling.scheduler.types import Decision
from gcs.policy.autoscaling.scheduler.types import InstanceStatus as S

_NARRATED = frozenset({"infeasible", "capped"})
"""Held-back types ("skip") are told by :class:`CapacityWatch` when the cloud refuses them."""


class CapacityWatch:
    def __init__(self, cache: UnavailableCapacity, events: EventLog) -> None:
        self.cache = cache
        self._events = events
        self._held: set[str] = set()
        self.failed_instances: Counter[str] = Counter()
        """Instances whose launch failed, by cause (capacity, quota, error), since start."""

    def observe(
        self, errors: Sequence[LaunchNodeError], allocated: Iterable[str], now_s: float
    ) -> None:
        """This round's launch errors and the node types that got a cloud instance."""
        for node_type in sorted(set(allocated)):
            if self.cache.record_allocated(node_type, now_s) is not None:
                self._events.add("capacity", released_event(node_type, allocated=True))
                self._held.discard(node_type)
        for error in errors:
            self.failed_instances[error.kind.value] += error.count
            held = self.cache.record_failure(error, now_s)
            self._events.add("launch-failed", failure_event(error, held))
        now_held = set(self.cache.held_back(now_s))
        for node_type in sorted(self._held - now_held):
            self._events.add("capacity", released_event(node_type, allocated=False))
        self._held = now_held

    def unavailable(self, now_s: float) -> dict[str, str]:
        return self.cache.unavailable(now_s)

    def cancel_queued(
        self, instances: Mapping[str, Instance], now_s: float
    ) -> list[InstanceUpdate]:
        """QUEUED launches of a held-back type are cancelled: they would be refused, and
        while they wait the scheduler counts them and picks no other type."""
        held = self.cache.held_back(now_s)
        return [
            InstanceUpdate(
                i.instance_id,
                S.TERMINATED,
                details=f"allocation canceled: {i.instance_type} is held back "
                f"({held[i.instance_type].why()})",
            )
            for i in instances.values()
            if i.status is S.QUEUED and i.instance_type in held
        ]


class DecisionNotes:
    """Scheduler verdicts on unplaced demand as events, each once until it changes."""

    def __init__(self, events: EventLog) -> None:
        self._events = events
        self._said: dict[str, str] = {}

    def note(self, decisions: Sequence[Decision]) -> None:
        current: dict[str, str] = {}
        for d in decisions:
            if d.action not in _NARRATED:
                continue
            key = f"{d.action}:{d.subject}"
            # the leading count ("3 pending ...") changes every round; the verdict does not
            gist = d.reason.split(" ", 1)[1] if d.reason[:1].isdigit() else d.reason
            current[key] = gist
            if self._said.get(key) != gist:
                self._events.add(d.action, d.reason[:1].upper() + d.reason[1:])
        self._said = current
