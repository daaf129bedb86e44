"""Repeated per-request log lines, counted and sampled.

A broken or hostile client can cause one warning per request (undecodable or oversized
requests, HTTP/2 connection errors): logged one line each, 100,000 bad requests were 31,797
lines.  Each event is counted (``gcs_rpc_warnings_total{event}``) and logged for its first
``first`` occurrences, then at most once per ``interval_s``, that line saying how many were
left out since the previous one (``suppressed``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import structlog
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Metric

from gcs.base.clock import Clock, SystemClock

log = structlog.get_logger("gcs.rpc")


class _Event:
    __slots__ = ("count", "next_at", "suppressed")

    def __init__(self) -> None:
        self.count = 0
        self.suppressed = 0
        self.next_at = float("-inf")


class WarningSampler:
    def __init__(
        self,
        clock: Clock | None = None,
        *,
        first: int = 10,
        interval_s: float = 10.0,
        logger: Any = None,
    ) -> None:
        self._clock = clock if clock is not None else SystemClock()
        self._first = first
        self._interval = interval_s
        self._log = logger if logger is not None else log
        self._events: dict[str, _Event] = {}

    def warn(self, event: str, **fields: Any) -> None:
        self._emit(self._log.warning, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(self._log.info, event, fields)

    def _emit(self, write: Any, event: str, fields: dict[str, Any]) -> None:
        state = self._events.get(event)
        if state is None:
            state = self._events[event] = _Event()
        state.count += 1
        if state.count <= self._first:
            write(event, **fields)
            return
        now = self._clock.monotonic_s()
        if now < state.next_at:
            state.suppressed += 1
            return
        state.next_at = now + self._interval
        suppressed, state.suppressed = state.suppressed, 0
        write(event, suppressed=suppressed, **fields)

    def count(self, event: str) -> int:
        state = self._events.get(event)
        return state.count if state is not None else 0

    def metric_families(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "gcs_rpc_warnings",
            "Repeated per-request warnings (bad requests, HTTP/2 connection errors), by event; "
            "the log keeps a sample of them",
            labels=["event"],
        )
        for event, state in sorted(self._events.items()):
            family.add_metric([event], state.count)
        return [family]
