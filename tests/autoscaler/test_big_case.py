"""The benchmark's big case decides what Ray 2.60 decided (autoscaler-v2.md §6)."""

from __future__ import annotations

import sys
from pathlib import Path

from gcs.policy.autoscaling.scheduler import schedule
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
