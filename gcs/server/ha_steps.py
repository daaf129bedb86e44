"""When each step of a takeover or a planned handover happened, for the logs and the bench.

One :class:`Steps` per takeover (the successor: ``noticed`` -> ``acquired`` -> ``drained``
-> ``loaded`` -> ``built`` -> ``bound`` -> ``recorded``) and per handover (the leader:
``held`` -> ``quiesced`` -> ``notice_written`` -> ``released`` -> ``successor_seen`` ->
``handed_off``), logged once with the ``ha.leader`` / ``ha.handed_over`` event as
``steps``: the injected clock's monotonic seconds (``CLOCK_MONOTONIC`` in a real server,
one time line for every process on a host, so ``bench.ha.handover`` lines both members'
steps up).
"""

from __future__ import annotations

from gcs.base.clock import Clock

__all__ = ["Steps"]


class Steps:
    """Named monotonic timestamps, in the order marked (a step marked again keeps its first
    time: a retried acquire's first notice is when the handover was seen)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.at: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.at.setdefault(name, self._clock.monotonic_s())

    def merge(self, other: dict[str, float]) -> None:
        for name, at in other.items():
            self.at.setdefault(name, at)

    def fields(self) -> dict[str, float]:
        """For a log event: every step's time, 0.1 ms resolution."""
        return {name: round(at, 4) for name, at in self.at.items()}
