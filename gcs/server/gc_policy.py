"""Bounded cyclic-GC pauses for a server whose long-lived heap grows after start-up.

Python's collector rescans the old generations in proportion to the heap: at 2,000 raylets
(~400k tracked objects, mostly per-node clients) one full collection costs 130-300 ms of
CPU, i.e. a read stalled that long.  ``SurvivorFreezer`` freezes (``gc.freeze``) what
survives a generation-1 collection, so automatic collections only ever scan young objects.

Frozen objects are still freed by reference counting (a dropped raylet client leaves no
cycles), but a frozen object that later ends up in a reference cycle (a task that was in
flight when frozen and then fails: exception -> traceback -> frame) is never reclaimed by
an automatic collection.  ``reclaim_if_grown`` bounds that: once the process's resident
memory has grown by ``growth`` since the last reclaim (and is past a floor) it runs one
full collection over everything (the pause Python's own policy takes after similar
growth), so memory stays within a constant factor of the live heap.  (Resident memory,
not ``gc.get_freeze_count``: that walks the frozen list, ~40 ms at 2,000 raylets.)
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable

import structlog

from gcs.base.clock import Clock

log = structlog.get_logger("gcs.server")

RECLAIM_CHECK_S = 1.0


def freeze_start_heap() -> None:
    """Collect, then freeze what survives (start-up's long-lived heap: modules, loaded
    state), so that no automatic collection scans it again.  A hot standby does this once
    its warm copy is loaded, not in the takeover's term (a full collection there: ~35 ms at
    10,000 nodes)."""
    gc.collect()
    gc.freeze()


def resident_bytes() -> int:
    """This process's resident set size (Linux ``/proc``); 0 where unavailable."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class SurvivorFreezer:
    """A ``gc.callbacks`` hook (install with ``gc.callbacks.append(freezer)``)."""

    def __init__(
        self,
        growth: float = 2.0,
        rss: Callable[[], int] = resident_bytes,
        floor_bytes: int = 512 << 20,
    ) -> None:
        if growth <= 1.0:
            raise ValueError(f"gc reclaim growth must be > 1, got {growth}")
        self._growth = growth
        self._rss = rss
        self._floor = floor_bytes
        """Below this resident size no reclaim runs: a 2,000-raylet GCS (~150 MB) never
        pauses for one; the valve is for leaks, not for ordinary growth."""
        self.baseline = rss()
        """Resident bytes after the last reclaim (or at construction)."""
        self.reclaims = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        # Right after a gen-1 (or gen-2) collection, generations 0 and 1 are empty: what is
        # left has survived two collections and is long-lived.
        if phase == "stop" and info["generation"] >= 1:
            gc.freeze()

    def reclaim_if_grown(self) -> bool:
        """Unfreeze, collect everything, freeze again, when resident memory has grown
        ``growth``-fold since the last time; call it from the event loop, not from a GC
        callback (``gc.collect`` does nothing while a collection is running)."""
        rss = self._rss()
        if not self.baseline or rss <= max(self._growth * self.baseline, self._floor):
            return False
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.baseline = self._rss()
        self.reclaims += 1
        return True


class GcTuning:
    """The GC policy as a component.  ``load()`` (after everything else loaded): freeze
    what start-up loaded, collect young objects in small batches, and freeze what survives a
    generation-1 collection (``SurvivorFreezer``), so no automatic collection scans the
    long-lived heap.  ``run()``: the safety valve, one full collection when resident memory
    doubled, checked every second of the injected clock.  ``close()``: unhook the freezer.
    ``gen0_threshold`` 0 leaves Python's GC as it is."""

    name = "gc"

    def __init__(
        self,
        clock: Clock,
        *,
        gen0_threshold: int,
        gen1_threshold: int,
        freeze_survivors: bool,
        start_heap_frozen: bool = False,
    ) -> None:
        """``start_heap_frozen``: this process froze its start-up heap already (an HA
        standby does when its warm copy is loaded): ``gc.get_freeze_count`` is not asked,
        it walks every frozen object (~10 ms at 10,000 nodes, in a takeover's path)."""
        self._clock = clock
        self._start_heap_frozen = start_heap_frozen
        self._gen0 = gen0_threshold
        self._gen1 = gen1_threshold
        self._freeze_survivors = freeze_survivors
        self.freezer: SurvivorFreezer | None = None

    async def load(self) -> None:
        if self._gen0 <= 0:
            return
        if not self._start_heap_frozen and gc.get_freeze_count() == 0:  # once per process
            freeze_start_heap()
        _, _, gen2 = gc.get_threshold()
        gc.set_threshold(self._gen0, self._gen1, max(gen2, 100))
        if self._freeze_survivors:
            self.freezer = SurvivorFreezer()
            gc.callbacks.append(self.freezer)

    async def run(self) -> None:
        while True:
            if self.freezer is not None and self.freezer.reclaim_if_grown():
                log.info("gc.reclaimed_frozen", resident_bytes=self.freezer.baseline)
            await self._clock.sleep(RECLAIM_CHECK_S)

    async def close(self) -> None:
        if self.freezer is not None and self.freezer in gc.callbacks:
            gc.callbacks.remove(self.freezer)
