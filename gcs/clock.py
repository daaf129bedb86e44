"""Injected time: managers read a :class:`Clock`, tests drive a :class:`FakeClock`."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Wall-clock seconds since the epoch (for timestamps on the wire)."""

    def monotonic_s(self) -> float:
        """Monotonic seconds (for durations and deadlines)."""


class SystemClock:
    def now_s(self) -> float:
        return time.time()

    def monotonic_s(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._now = start_s
        self._mono = 1000.0

    def now_s(self) -> float:
        return self._now

    def monotonic_s(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._mono += seconds


def now_ms(clock: Clock) -> int:
    return int(clock.now_s() * 1000)
