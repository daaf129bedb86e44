"""A fake clock a test can wait on: "something now sleeps on me" is an event, so a test
advances time exactly when the code under test waits for it (no polling, no wall time)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gcs.base.clock import FakeClock, Timer

__all__ = ["SteppedClock"]


class SteppedClock(FakeClock):
    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        super().__init__(start_s)
        self._slept: asyncio.Event | None = None

    async def sleep(self, seconds: float) -> None:
        if self._slept is not None:
            self._slept.set()  # the waiter runs after this task registered its sleep
        await super().sleep(seconds)

    def call_later(self, seconds: float, callback: Callable[[], object]) -> Timer:
        if self._slept is not None:
            self._slept.set()  # a deadline (Clock.timeout, within) waits on this clock too
        return super().call_later(seconds, callback)

    async def sleeping(self, count: int = 1) -> None:
        """Return once ``count`` sleepers wait on this clock."""
        while self.sleepers < count:
            self._slept = asyncio.Event()
            await self._slept.wait()

    async def advance_when_sleeping(self, seconds: float, count: int = 1) -> None:
        """Wait for ``count`` sleepers, then move time ``seconds``."""
        await self.sleeping(count)
        self.advance(seconds)
