"""Simulator: the real reconciler against a simulated cloud on a virtual clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.simulator import (
    WorkloadError,
    parse_workload,
    simulate,
    summary,
    write_report,
)

CLUSTER = parse_cluster_config(
    {
        "max_workers": 30,
        "upscaling_speed": 1,
        "idle_timeout_minutes": 2,
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "max_workers": 0},
            "cpu8": {"resources": {"CPU": 8}, "max_workers": 30},
            "gpu": {"resources": {"CPU": 4, "GPU": 1}, "max_workers": 4},
        },
    }
)

WORKLOAD = {
    "duration": "3h",
    "interval_s": 5,
    "cloud": {
        "launch_delay_s": 40,
        "boot_delay_s": 20,
        "failure_rate": 0.1,
        "capacity": {"gpu": 2},
        "seed": 7,
    },
    "tasks": [
        {"at": "5m", "count": 60, "resources": {"CPU": 2}, "duration": "20m"},
        {"at": "1h", "count": 3, "resources": {"GPU": 1}, "duration": "10m"},
        {"at": "1h30m", "count": 16, "resources": {"CPU": 8}, "duration": "5m", "every": "20m",
         "until": "2h30m"},
    ],
}  # fmt: skip


async def test_runs_scales_and_reports(tmp_path: Path) -> None:
    result = await simulate(CLUSTER, parse_workload(WORKLOAD))
    doc = summary(result)
    assert doc["tasks"]["started"] == doc["tasks"]["total"] == 60 + 3 + 16 * 4
    assert 0 < doc["peak_workers"] <= 30
    assert doc["failed_launches"] > 0  # 10% failure rate and a GPU capacity of 2 show up
    assert doc["time_to_capacity_s"]["max"] is not None
    # everything scaled back down once idle: only the head is left at the end
    assert sum(result.samples[-1].nodes_by_type.values()) == 1
    files = write_report(result, tmp_path / "report")
    assert files["timeline"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "time to capacity" in (tmp_path / "report" / "summary.txt").read_text()


BURSTY = {
    "duration": "2h",
    "cloud": {"launch_delay_s": 30, "boot_delay_s": 20, "failure_rate": 0.05, "seed": 3},
    "tasks": [
        {"at": 0, "count": 200, "resources": {"CPU": 1}, "duration": "10m", "every": "30m"},
        {"at": "7m", "count": 5, "resources": {"CPU": 8}, "duration": "3m", "every": "40m"},
    ],
}


@pytest.mark.parametrize("workload", [WORKLOAD, BURSTY], ids=["mixed", "bursty"])
async def test_skipping_quiet_rounds_changes_nothing(workload: dict) -> None:  # type: ignore[type-arg]
    """The fast-forward is exact: the same summary, the same event log and the same
    timeline either way, with rounds in which tasks only finished skipped too."""
    wl = parse_workload(workload)
    fast = await simulate(CLUSTER, wl)
    slow = await simulate(CLUSTER, wl, skip_quiet=False)
    assert fast.skipped_rounds > 0 and slow.skipped_rounds == 0
    assert fast.skipped_finish_rounds > 0
    assert summary(fast) == summary(slow)
    assert fast.events == slow.events
    assert fast.samples == slow.samples


async def test_skipping_is_exact_on_the_500_node_bursty_burst() -> None:
    """The bench's bursty workload through its first burst (25 min: 4,000 tasks, ~500
    nodes launched, filled and drained), many equally idle (which one drains first is where
    an inexact skip shows).  A whole hour (two bursts) took twice the CPU and caught no
    more of the faults planted to compare: an idle wake-up made 30 s late is seen in
    both."""
    from bench.autoscaler.simulate_day import CLUSTER as BIG
    from bench.autoscaler.simulate_day import WORKLOADS
    from gcs.autoscaler.reconciler import ReconcileConfig

    wl = parse_workload({**WORKLOADS["bursty"], "duration": "25m"})
    rc = ReconcileConfig(upscaling_speed=100, max_concurrent_launches=100)
    fast = await simulate(BIG, wl, reconcile=rc)
    slow = await simulate(BIG, wl, reconcile=rc, skip_quiet=False)
    assert fast.skipped_finish_rounds > 0
    assert summary(fast) == summary(slow)
    assert fast.events == slow.events


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"duration": "tomorrow"}, "duration: expected a duration"),
        ({"tasks": [{"count": 1, "resources": {"CPU": -1}}]}, "tasks[0].resources.CPU"),
        ({"tasks": [{"resources": {"CPU": 1}, "every": 0}]}, "tasks[0].every: must be > 0"),
        ({"cloud": {"failure_rate": 2}}, "cloud.failure_rate"),
        ({"cloud": {"lunch_delay_s": 2}}, "cloud.lunch_delay_s: unknown key"),
    ],
)
def test_bad_workloads_name_the_field(patch: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(WorkloadError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_workload({**WORKLOAD, **patch})
