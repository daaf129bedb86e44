"""Abuse limits of the front server's HTTP/2 layer, as nghttp2 and grpc C-core apply them.

* :class:`TokenBucket` -- nghttp2's rate limiter (``nghttp2_ratelim``): ``burst`` tokens at
  first and at most, ``rate`` tokens regained per second; an event that finds no token is
  one too many.  nghttp2 uses it for incoming RST_STREAM (burst 1000, rate 33/s: the
  "rapid reset" limit, CVE-2023-44487) and for "glitches", frames a well-behaved peer has
  no reason to send often (empty DATA without END_STREAM, PRIORITY, unknown frame types...;
  burst 10,000, rate 330/s).
* :class:`PingPolicy` -- grpc C-core's ``Chttp2PingAbusePolicy``: a PING that arrives
  sooner than the minimum interval after the previous one is a strike, more than
  ``max_strikes`` strikes is abuse; strikes are forgiven whenever the server sends HEADERS
  or DATA.  With no stream open the interval is two hours (RFC 1122's TCP keepalive).
"""

from __future__ import annotations

IDLE_PING_INTERVAL_S = 7200.0


class TokenBucket:
    __slots__ = ("_burst", "_rate", "_stamp", "_tokens")

    def __init__(self, burst: int, rate: float, now: float) -> None:
        self._burst = float(burst)
        self._rate = rate
        self._tokens = float(burst)
        self._stamp = now

    def take(self, now: float) -> bool:
        """One token if there is one; False when the bucket is empty (the limit is hit)."""
        if now > self._stamp:
            self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class PingPolicy:
    __slots__ = ("_last", "_max_strikes", "_min_interval", "strikes")

    def __init__(self, min_interval_s: float, max_strikes: int) -> None:
        self._min_interval = min_interval_s
        self._max_strikes = max_strikes
        self._last = float("-inf")
        self.strikes = 0

    def received(self, now: float, *, idle: bool) -> bool:
        """A PING arrived; True when it is one too many."""
        interval = IDLE_PING_INTERVAL_S if idle else self._min_interval
        allowed_at = self._last + interval
        self._last = now
        if allowed_at <= now:
            return False
        self.strikes += 1
        return self._max_strikes != 0 and self.strikes > self._max_strikes

    def forgive(self) -> None:
        """The server sent HEADERS or DATA: the peer may ping again."""
        self._last = float("-inf")
        self.strikes = 0
