"""A token bucket bounding how many raylet calls start per second (CPU, not just sockets).

Bounded concurrency alone does not bound work: calls to unreachable raylets fail in
microseconds, so 50,000 of them would keep the event loop busy without pause.  The rate is
steered by event-loop lag (:class:`LagGovernor`), so the GCS keeps answering its own RPCs.
"""

from __future__ import annotations

import asyncio

from gcs.base.clock import Clock


class RateLimiter:
    """At most ``rate_per_s`` acquisitions per second on average and ``burst`` at once."""

    def __init__(self, rate_per_s: float, burst: float, clock: Clock) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"rate_per_s must be > 0 and burst >= 1, got {rate_per_s}, {burst}")
        self._rate = rate_per_s
        self._burst = burst
        self._max_burst = burst
        self._tokens = burst
        self._clock = clock
        self._now = clock.monotonic_s
        self._stamp = self._now()

    @property
    def rate(self) -> float:
        return self._rate

    def set_rate(self, rate_per_s: float) -> None:
        """New average rate; the burst never exceeds one second's worth."""
        self._refill(self._now())
        self._rate = rate_per_s
        self._burst = max(1.0, min(self._max_burst, rate_per_s))
        self._tokens = min(self._tokens, self._burst)  # a debt stays a debt

    def _refill(self, now: float) -> None:
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now

    def reserve(self) -> float:
        """Take a token now, possibly on credit: returns the seconds to wait before using it.

        Waiting callers are served in order with one sleep each (no retry loop); the credit
        is bounded by the number of callers, which the gateway's slots bound.
        """
        self._refill(self._now())
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate

    async def acquire(self) -> None:
        wait_s = self.reserve()
        if wait_s > 0:
            await self._clock.sleep(wait_s)


class LagGovernor:
    """Steers a :class:`RateLimiter` by event-loop lag, which is what the GCS's own RPCs feel.

    Every ``interval_s`` it measures how late a sleep wakes up: above ``high_lag_s`` the rate
    is halved (down to ``min_rate``), below ``low_lag_s`` it grows by 10% (up to
    ``max_rate``).  So raylet traffic takes what the loop can spare, whatever the machine.

    :meth:`run` is the GCS process's one loop-lag probe: the one sleep on wall time outside
    ``gcs.base.clock`` (how late a wall-clock sleep wakes is the lag; a FakeClock has none), as
    ``tests/unit/test_one_way_to_run_work.py`` allows by name.
    """

    def __init__(
        self,
        limiter: RateLimiter,
        *,
        max_rate: float,
        min_rate: float,
        interval_s: float = 0.1,
        high_lag_s: float = 0.1,
        low_lag_s: float = 0.02,
    ) -> None:
        self.limiter = limiter
        self.max_rate = max_rate
        self.min_rate = min(min_rate, max_rate)
        self.interval_s = interval_s
        self.high_lag_s = high_lag_s
        self.low_lag_s = low_lag_s

    def observe(self, lag_s: float) -> float:
        """Adjust the rate for one lag sample; returns the new rate."""
        rate = self.limiter.rate
        if lag_s > self.high_lag_s:
            rate = max(self.min_rate, rate / 2)
        elif lag_s < self.low_lag_s:
            rate = min(self.max_rate, rate * 1.1)
        self.limiter.set_rate(rate)
        return rate

    async def run(self) -> None:
        """The loop-lag probe (wall time by nature; see the class doc)."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval_s)
            self.observe(loop.time() - start - self.interval_s)
