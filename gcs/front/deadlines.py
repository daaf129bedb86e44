"""Call deadlines of the front server (``grpc-timeout``), on the injected clock.

One heap and one sleeper task (under the server's :class:`~gcs.base.background.Background`)
instead of a loop timer per call: a held poll or a running unary call with a deadline costs
a heap entry, and a test moves deadlines with a :class:`~gcs.base.clock.FakeClock` instead of
waiting wall time.  The sleeper sleeps until the earliest deadline; a deadline earlier than
that (rare: clients of one method send the same timeout) restarts it.  A cancelled deadline
stays in the heap until it is due (lazy deletion; the heap is compacted when most of it is
cancelled).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

import structlog

from gcs.base.background import Background
from gcs.base.clock import Clock

log = structlog.get_logger("gcs.front")

_COMPACT_AT = 1024
"""Heap entries from which cancelled ones are dropped once they are the majority."""


class Deadline:
    """One call's deadline; :meth:`cancel` when the call ends first."""

    __slots__ = ("args", "callback", "cancelled")

    def __init__(self, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Deadlines:
    def __init__(self, clock: Clock, background: Background) -> None:
        self._clock = clock
        self._background = background
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._sleeper: asyncio.Task[Any] | None = None
        self._wake_at = math.inf
        self._firing = False

    def __len__(self) -> int:
        """Deadlines waiting (cancelled ones included until they are dropped)."""
        return len(self._heap)

    def add(self, seconds: float, callback: Callable[..., None], *args: Any) -> Deadline:
        """``callback(*args)`` once ``seconds`` of the clock have passed, unless cancelled."""
        deadline = Deadline(callback, args)
        due = self._clock.monotonic_s() + seconds
        heap = self._heap
        heapq.heappush(heap, (due, next(self._seq), deadline))
        if len(heap) >= _COMPACT_AT and len(heap) & (_COMPACT_AT - 1) == 0:
            self._compact()
        if due < self._wake_at and not self._firing:
            self._wake_at = due
            if self._sleeper is not None:
                self._sleeper.cancel()
            self._sleeper = self._background.spawn(self._run(), "deadlines")
        return deadline

    def _compact(self) -> None:
        live = [entry for entry in self._heap if not entry[2].cancelled]
        if len(live) * 2 < len(self._heap):
            heapq.heapify(live)
            self._heap = live

    async def _run(self) -> None:
        clock = self._clock
        while self._heap:
            due, _, deadline = self._heap[0]
            if deadline.cancelled:
                heapq.heappop(self._heap)
                continue
            now = clock.monotonic_s()
            if due > now:
                self._wake_at = due
                await clock.sleep(due - now)
                continue
            heapq.heappop(self._heap)
            deadline.cancelled = True
            self._firing = True
            try:
                deadline.callback(*deadline.args)
            except Exception:  # one call's expiry must not end the others'
                log.exception("front.deadline_failed")
            finally:
                self._firing = False
        self._wake_at = math.inf
        self._sleeper = None
