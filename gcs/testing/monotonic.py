"""Monotonic-state checking for what a GCS answers from memory (jobs, nodes, actors,
placement groups): once a client saw a state -- or had a change to it acknowledged -- no
read that *started after* that must show an earlier state (a job RUNNING again after
FINISHED, a node ALIVE after DEAD, a known job missing).  Reads that overlap may see either
order; each state kind gives its states a rank (a missing entry ranks 0)."""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

__all__ = ["MonotonicCheck"]


@dataclass
class MonotonicCheck:
    _seen: dict[tuple[str, bytes], list[tuple[float, float, int, bool]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    observations: int = 0

    def acked(self, kind: str, key: bytes, rank: int, invoked: float, answered: float) -> None:
        """A change to ``rank`` acknowledged: later reads must show it (or later)."""
        self._seen[kind, key].append((answered, invoked, rank, False))
        self.observations += 1

    def read(self, kind: str, key: bytes, rank: int, invoked: float, answered: float) -> None:
        self._seen[kind, key].append((answered, invoked, rank, True))
        self.observations += 1

    def known_before(self, kind: str, invoked: float) -> list[bytes]:
        """Keys of ``kind`` whose creation was acknowledged before ``invoked``."""
        return [
            key
            for (k, key), seen in self._seen.items()
            if k == kind and any(not is_read and at < invoked for at, _, _, is_read in seen)
        ]

    def violations(self) -> list[str]:
        out = []
        for (kind, key), seen in self._seen.items():
            by_answer = sorted(seen)
            answered = [s[0] for s in by_answer]
            best, highest = [], 0
            for s in by_answer:
                highest = max(highest, s[2])
                best.append(highest)
            for at, invoked, rank, is_read in seen:
                if not is_read:
                    continue
                before = bisect.bisect_left(answered, invoked)
                if before and best[before - 1] > rank:
                    out.append(
                        f"{kind} {key.hex()}: read at {invoked:.3f}-{at:.3f} shows rank {rank} "
                        f"after rank {best[before - 1]} was seen"
                    )
        return out
