"""The simulator's report shows failures and why, and its picture reads at a glance: a panel
per resource kind, failed launches marked, each limit drawn, legends outside the data, the
head not stacked into the worker count."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.simulator import parse_workload, simulate, summary, write_report
from gcs.autoscaler.simulator.report import summary_text
from gcs.autoscaler.simulator.run import SimResult
from gcs.autoscaler.simulator.timeline import build_figure, resource_ceiling, type_limits

CLUSTER = parse_cluster_config(
    {
        "max_workers": 6,
        "upscaling_speed": 1,
        "idle_timeout_minutes": 2,
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 2, "memory": 4 * 2**30}, "max_workers": 0},
            "cpu4": {"resources": {"CPU": 4, "memory": 8 * 2**30}, "max_workers": 4},
            "gpu1": {"resources": {"CPU": 4, "GPU": 1, "memory": 8 * 2**30}, "max_workers": 3},
        },
    }
)
WORKLOAD = parse_workload(
    {
        "duration": "2h",
        "cloud": {"launch_delay_s": 30, "boot_delay_s": 10, "capacity": {"gpu1": 1}, "seed": 2},
        "tasks": [{"at": "10m", "count": 3, "resources": {"GPU": 1}, "duration": "20m"}],
    }
)


@pytest.fixture(scope="module")
def result() -> Iterator[SimResult]:
    import asyncio

    yield asyncio.run(simulate(CLUSTER, WORKLOAD))


class TestFailuresAreExplained:
    def test_events_say_what_failed_and_why(self, result: SimResult) -> None:
        """It logged thousands of "launch Adding 1 x gpu1" and never a failure."""
        failed = [m for _t, kind, m in result.events if kind == "launch-failed"]
        assert failed and failed[0].startswith(
            "Launch of 1 x gpu1 failed: the cloud has no capacity for it (capacity exhausted: "
            "all 1 gpu1 instances of the cloud are in use); gpu1 is held back 60 s"
        )
        assert any(kind == "capacity" for _t, kind, _m in result.events)

    def test_summary_counts_failures_by_cause(self, result: SimResult) -> None:
        doc = summary(result)
        assert doc["failed_launches_by_cause"] == {"capacity": doc["failed_launches"]}
        assert doc["failed_launches_per_day"] == pytest.approx(
            doc["failed_launches"] * 12, rel=0.01
        )
        assert "failed: " in summary_text(doc) and " capacity; " in summary_text(doc)


class TestTimeline:
    def test_limits(self, result: SimResult) -> None:
        """gpu1 is capped by the cloud (1 < max_workers 3); CPU at most the head's 2 plus
        4 cpu4 and 1 gpu1 within max_workers 6 (4 * 4 + 1 * 4)."""
        assert type_limits(result) == {"cpu4": (4, "max_workers"), "gpu1": (1, "cloud capacity")}
        assert resource_ceiling(result, "CPU") == 2 + 16 + 4
        assert resource_ceiling(result, "GPU") == 1

    def test_a_panel_per_resource_kind_and_legends_outside(self, result: SimResult) -> None:
        import matplotlib.pyplot as plt

        fig = build_figure(result)
        try:
            fig.canvas.draw()
            titles = [ax.get_title(loc="left") for ax in fig.axes]
            assert titles == [
                "Worker nodes by type (the head is not counted)",
                "CPU: capacity, use and waiting demand",
                "GPU: capacity, use and waiting demand",
                "memory: capacity, use and waiting demand",
                f"Failed launches ({result.failed_launches} instances)",
            ]
            assert fig.axes[3].get_ylabel() == "memory (GiB)"
            renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
            for ax in fig.axes:
                legend = ax.get_legend()
                assert legend is not None, ax.get_title(loc="left")
                box, area = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
                assert box.x0 >= area.x1, f"legend over the data in {ax.get_title(loc='left')}"
            labels = fig.axes[0].get_legend_handles_labels()[1]
            assert "head" not in labels
            assert "gpu1 limit 1 (cloud capacity)" in labels
            assert "cluster max_workers 6" in labels
            markers = fig.axes[-1].collections
            assert sum(len(c.get_offsets()) for c in markers) == len(result.failures)
        finally:
            plt.close(fig)

    def test_the_png_is_written(self, result: SimResult, tmp_path: Path) -> None:
        files = write_report(result, tmp_path / "report")
        assert files["timeline"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "Launch of 1 x gpu1 failed" in files["events"].read_text()
