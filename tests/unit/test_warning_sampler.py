"""Repeated per-request warnings: every one counted, the log sampled (first N, then one per
interval carrying how many were left out), on an injected clock."""

from __future__ import annotations

from typing import Any

from gcs.base.clock import FakeClock
from gcs.rpc.warnings import WarningSampler


class Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    info = warning


def test_first_n_then_one_per_interval_with_the_suppressed_count() -> None:
    clock, out = FakeClock(), Lines()
    sampler = WarningSampler(clock, first=3, interval_s=10.0, logger=out)
    for i in range(100):
        sampler.warn("rpc.undecodable_request", n=i)
    assert [f["n"] for _, f in out.lines] == [0, 1, 2, 3]  # 3 first, then the interval's one
    clock.advance(5.0)
    sampler.warn("rpc.undecodable_request", n=100)
    assert len(out.lines) == 4
    clock.advance(5.0)
    sampler.warn("rpc.undecodable_request", n=101)
    assert out.lines[-1] == ("rpc.undecodable_request", {"n": 101, "suppressed": 97})
    assert sampler.count("rpc.undecodable_request") == 102


def test_events_are_sampled_and_counted_apart() -> None:
    out = Lines()
    sampler = WarningSampler(FakeClock(), first=1, interval_s=10.0, logger=out)
    for _ in range(5):
        sampler.warn("a")
        sampler.info("b")
    assert [e for e, _ in out.lines] == ["a", "b", "a", "b"]
    [family] = sampler.metric_families()
    assert {s.labels["event"]: s.value for s in family.samples} == {"a": 5, "b": 5}
