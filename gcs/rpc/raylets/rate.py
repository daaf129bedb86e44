"""A token bucket bounding how many raylet calls start per second (CPU, not just sockets).

Bounded concurrency alone does not bound work: calls to unreachable raylets fail in
microseconds, so 50,000 of them would keep the event loop busy without pause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class RateLimiter:
    """At most ``rate_per_s`` acquisitions per second on average and ``burst`` at once."""

    def __init__(self, rate_per_s: float, burst: float, now: Callable[[], float]) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"rate_per_s must be > 0 and burst >= 1, got {rate_per_s}, {burst}")
        self._rate = rate_per_s
        self._burst = burst
        self._tokens = burst
        self._now = now
        self._stamp = now()

    def try_acquire(self) -> float:
        """0.0 when a token was taken, else the seconds until one will be available."""
        now = self._now()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self._rate

    async def acquire(self) -> None:
        while (wait_s := self.try_acquire()) > 0:  # noqa: ASYNC110 (refilled by time, not an event)
            await asyncio.sleep(wait_s)
