"""The autoscaler's event log: what it launched, terminated or failed to do, and why.

Bounded (oldest dropped), newest last; ``gcs status`` shows the tail as ``ray status``
shows its recent events.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from dataclasses import dataclass

from gcs.base.clock import Clock


@dataclass(frozen=True, slots=True)
class AutoscalerEvent:
    time_s: float
    kind: str
    message: str


class EventLog:
    def __init__(self, clock: Clock, *, capacity: int = 200) -> None:
        self._clock = clock
        self._events: deque[AutoscalerEvent] = deque(maxlen=capacity)
        self.version = 0
        self.counts: Counter[str] = Counter()
        """Events by kind since start (monotonic, unlike the bounded log)."""

    def add(self, kind: str, message: str) -> None:
        self._events.append(AutoscalerEvent(self._clock.now_s(), kind, message))
        self.version += 1
        self.counts[kind] += 1

    def recent(self, n: int = 20) -> list[AutoscalerEvent]:
        return list(self._events)[-n:]

    def to_json(self, n: int = 50) -> bytes:
        return json.dumps(
            [{"t": e.time_s, "kind": e.kind, "message": e.message} for e in self.recent(n)]
        ).encode()


def events_from_json(raw: bytes) -> list[AutoscalerEvent]:
    return [
        AutoscalerEvent(float(e["t"]), str(e["kind"]), str(e["message"])) for e in json.loads(raw)
    ]
