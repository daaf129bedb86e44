"""Injected time: managers read a :class:`Clock`, tests drive a :class:`FakeClock`."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Wall-clock seconds since the epoch (for timestamps on the wire)."""

    def monotonic_s(self) -> float:
        """Monotonic seconds (for durations and deadlines)."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""


class SystemClock:
    def now_s(self) -> float:
        return time.time()

    def monotonic_s(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to; its sleepers wake when :meth:`advance` passes
    their time (in the order of their times)."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._now = start_s
        self._mono = 1000.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now_s(self) -> float:
        return self._now

    def monotonic_s(self) -> float:
        return self._mono

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), wake))
        await wake

    @property
    def sleepers(self) -> int:
        """Sleepers still waiting (cancelled ones excluded)."""
        return sum(1 for _, _, wake in self._sleepers if not wake.done())

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._mono += seconds
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, wake = heapq.heappop(self._sleepers)
            if not wake.done():
                wake.set_result(None)


def now_ms(clock: Clock) -> int:
    return int(clock.now_s() * 1000)
