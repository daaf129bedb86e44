"""The benchmark's big case decides what Ray 2.60 decided (autoscaler-v2.md §6)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gcs.autoscaler.scheduler import schedule
from tests.autoscaler.scenario_io import our_decisions, scenario_input

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "scheduler"))
from workload import scenario


class TestBigCase:
    """1 head + 950 running + 50 requested nodes, 10,000 requests in 5 shapes."""

    def test_same_launches_and_infeasible_as_ray(self) -> None:
        """Ray 2.60: launch cpu64:159, gpu8:126; 50 x {CPU:1, custom:1} infeasible."""
        dec = our_decisions(schedule(scenario_input(scenario(1))))
        assert dec["launch"] == {"cpu64": 159, "gpu8": 126}
        assert dec["infeasible"] == {(("CPU", 1.0), ("custom", 1.0)): 50}
        assert dec["terminate"] == []

    def test_runs_well_under_a_second(self) -> None:
        """Ray takes ~160 s on this input; we allow 2 s here (shared CI cores)."""
        inp = scenario_input(scenario(1))
        t0 = time.perf_counter()
        schedule(inp)
        assert time.perf_counter() - t0 < 2.0
