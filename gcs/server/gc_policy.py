"""Bounded cyclic-GC pauses for a server whose long-lived heap grows after start-up.

Python's collector rescans the old generations in proportion to the heap: at 2,000 raylets
(~400k tracked objects, mostly per-node clients) one full collection costs 130-300 ms of
CPU, i.e. a read stalled that long.  ``SurvivorFreezer`` freezes (``gc.freeze``) what
survives a generation-1 collection, so automatic collections only ever scan young objects.

Frozen objects are still freed by reference counting (a dropped raylet client leaves no
cycles), but a frozen object that later ends up in a reference cycle (a task that was in
flight when frozen and then fails: exception -> traceback -> frame) is never reclaimed by
an automatic collection.  ``reclaim_if_grown`` bounds that: once the frozen heap has grown
by ``growth`` since the last reclaim it runs one full collection over everything (the
pause Python's own policy would take after similar growth), so memory stays within a
constant factor of the live heap.
"""

from __future__ import annotations

import gc


class SurvivorFreezer:
    """A ``gc.callbacks`` hook (install with ``gc.callbacks.append(freezer)``)."""

    def __init__(self, growth: float = 2.0) -> None:
        if growth <= 1.0:
            raise ValueError(f"gc reclaim growth must be > 1, got {growth}")
        self._growth = growth
        self.baseline = gc.get_freeze_count()
        """Frozen-object count after the last full reclaim (or at construction)."""
        self.reclaims = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        # Right after a gen-1 (or gen-2) collection, generations 0 and 1 are empty: what is
        # left has survived two collections and is long-lived.
        if phase == "stop" and info["generation"] >= 1:
            gc.freeze()

    def reclaim_if_grown(self) -> bool:
        """Unfreeze, collect everything, freeze again, when the frozen heap has grown
        ``growth``-fold since the last time; call it from the event loop, not from a GC
        callback (``gc.collect`` does nothing while a collection is running)."""
        if gc.get_freeze_count() <= self._growth * max(self.baseline, 1000):
            return False
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.baseline = gc.get_freeze_count()
        self.reclaims += 1
        return True
