"""The unavailable-capacity cache: node types the cloud just refused are held back.

Without it the scheduler asks again for the type the cloud refused a round ago, and again
every round (4,067 failed ``gpu1`` launches in one simulated day with a cap of 3 GPU
instances).  Karpenter keeps a cache of unavailable offerings (a few minutes each, filled by
insufficient-capacity errors) and schedules around them; this is the same idea per node
type, with backoff:

* a launch refused for capacity or quota (:class:`LaunchErrorKind`) holds its node type
  back for ``initial_s``, doubling with every further refusal in a row up to ``max_s``;
  other errors are retried as before (Ray's behaviour);
* while held back the type is offered to the scheduler as unavailable, so pending demand
  falls back to the next type that fits (or waits, saying why);
* once the backoff is over one launch may probe the type again; a cloud instance of the
  type allocated after the hold ends the streak.

Pure policy: time is passed in, nothing is read from a clock here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gcs.policy.autoscaling.model import LaunchErrorKind, LaunchNodeError

HELD_BACK_KINDS = frozenset({LaunchErrorKind.CAPACITY, LaunchErrorKind.QUOTA})
_KIND_WORDS = {
    LaunchErrorKind.CAPACITY: "the cloud has no capacity for it",
    LaunchErrorKind.QUOTA: "a cloud quota refused it",
}


@dataclass(frozen=True)
class CapacityBackoff:
    """How long a refused node type is held back (``capacity_backoff`` in the cluster YAML)."""

    initial_s: float = 60.0
    """After the first refusal in a row."""
    max_s: float = 600.0
    """The longest hold, however many refusals in a row."""
    factor: float = 2.0
    """Each further refusal in a row multiplies the hold by this."""

    def hold_s(self, refusals: int) -> float:
        return min(self.max_s, self.initial_s * self.factor ** max(0, refusals - 1))


@dataclass(frozen=True)
class HeldBack:
    """One node type the cloud refused."""

    node_type: str
    until_s: float
    refusals: int
    """Refusals in a row (reset when an instance of the type is allocated)."""
    kind: LaunchErrorKind
    details: str

    held_s: float
    """How long this hold lasts (from the refusal)."""

    def why(self) -> str:
        """Constant for the whole hold (a reason that changed every round would be news
        every round)."""
        return (
            f"{_KIND_WORDS[self.kind]}: {self.details or self.kind.value}; held back "
            f"{self.held_s:.0f} s after the {_ordinal(self.refusals)} refusal in a row"
        )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class UnavailableCapacity:
    """Per node type: held back until when, after how many refusals in a row."""

    def __init__(self, backoff: CapacityBackoff | None = None) -> None:
        self.backoff = backoff or CapacityBackoff()
        self._entries: dict[str, HeldBack] = {}

    def record_failure(self, error: LaunchNodeError, now_s: float) -> HeldBack | None:
        """A launch failed; held back when the cloud refused it for capacity or quota."""
        if error.kind not in HELD_BACK_KINDS:
            return None
        old = self._entries.get(error.node_type)
        if old is not None and old.until_s > now_s:
            return old  # launched before the hold began: the same outage, no escalation
        refusals = 1
        if old is not None and now_s - old.until_s <= self.backoff.max_s:
            refusals = old.refusals + 1  # a refusal soon after the last hold: a streak
        hold = self.backoff.hold_s(refusals)
        entry = HeldBack(error.node_type, now_s + hold, refusals, error.kind, error.details, hold)
        self._entries[error.node_type] = entry
        return entry

    def record_allocated(self, node_type: str, now_s: float) -> HeldBack | None:
        """The cloud gave an instance of ``node_type``.  Once its hold is over this ends the
        streak (returns the entry dropped); during the hold it is a launch requested before
        the refusal arriving late, which says nothing about capacity now."""
        entry = self._entries.get(node_type)
        if entry is None or entry.until_s > now_s:
            return None
        return self._entries.pop(node_type)

    def held_back(self, now_s: float) -> dict[str, HeldBack]:
        return {t: e for t, e in self._entries.items() if e.until_s > now_s}

    def unavailable(self, now_s: float) -> dict[str, str]:
        """Node type -> why it is not launched now (the scheduler's ``unavailable_types``)."""
        return {t: e.why() for t, e in sorted(self.held_back(now_s).items())}

    def next_change_s(self, now_s: float) -> float:
        """When the next hold ends (``inf``: none): a round then may decide differently."""
        return min(
            (e.until_s for e in self._entries.values() if e.until_s > now_s), default=math.inf
        )


def failure_event(error: LaunchNodeError, held: HeldBack | None) -> str:
    """The event line for a failed launch: what failed, why, and what happens next."""
    what = f"Launch of {error.count} x {error.node_type} failed"
    why = error.details or error.kind.value
    if held is None:
        return f"{what}: {why}; it is retried"
    return (
        f"{what}: {_KIND_WORDS[held.kind]} ({why}); {error.node_type} is held back "
        f"{held.held_s:.0f} s ({_ordinal(held.refusals)} refusal in a row) and pending demand "
        "goes to other node types that fit"
    )


def released_event(node_type: str, allocated: bool) -> str:
    if allocated:
        return f"{node_type} has capacity again: an instance was allocated; its backoff is reset"
    return f"{node_type} hold is over: the next launch may try it again"
