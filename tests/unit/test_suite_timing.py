"""The suite's timing log summary (tests/suite_timing.py): each worker's busy seconds (the
longest is the critical path) and the seconds per directory, scope and test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.suite_timing import COLLECTION, group_cpu, summary


def _row(worker: str, nodeid: str, start: float, stop: float) -> dict[str, Any]:
    return {"worker": worker, "id": nodeid, "when": "call", "start": start, "stop": stop, "cpu": 1}


def test_worker_sums_and_interop_scopes() -> None:
    module = "tests/interop/test_dashboard.py"
    rows = [
        _row("gw0", f"{module}::test_a", 0, 30),
        _row("gw0", f"{module}::test_b", 30, 40),
        _row("gw1", "tests/unit/test_x.py::test_y", 0, 5),
    ]
    text = summary(rows, 5)
    assert "3 tests, first start to last stop 40 s" in text
    assert "gw0:    40.0 s in tests" in text and "gw1:     5.0 s in tests" in text
    assert f"     40.0  {module}\n" in text  # the module is one scope
    assert "     40.0  tests/interop\n" in text


def test_cgroup_cpu_goes_to_the_scope_that_ran_since_the_workers_last_line() -> None:
    """With GCS_SUITE_CGROUP each line carries its worker's cgroup CPU so far (Ray's
    processes included): a scope gets the growth since its worker's previous line."""
    module = "tests/interop/test_dashboard.py"
    rows = [
        {**_row("gw0", f"{module}::test_a", 0, 30), "group_cpu": 50.0},
        {**_row("gw1", "tests/unit/test_x.py::test_y", 0, 5), "group_cpu": 2.0},
        {**_row("gw0", f"{module}::test_b", 30, 40), "group_cpu": 70.0},
        {**_row("gw1", "tests/unit/test_x.py::test_z", 5, 6), "group_cpu": 2.5},
    ]
    text = summary(rows, 5)
    assert "CPU seconds of the workers' cgroups: 72.5 in all" in text
    assert f"     70.0  {module}\n" in text
    assert "      2.0  tests/unit/test_x.py::test_y\n" in text
    assert "      0.5  tests/unit/test_x.py::test_z" in text
    assert "     72.5  tests/" not in text  # directories apart: interop 70, unit 2.5
    assert "     70.0  tests/interop\n" in text and "      2.5  tests/unit" in text


def test_without_a_cgroup_no_cpu_section() -> None:
    text = summary([_row("gw0", "tests/unit/test_x.py::test_y", 0, 5)], 5)
    assert "cgroup" not in text


def test_group_cpu_reads_v1_and_v2(tmp_path: Path) -> None:
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "cpuacct.usage").write_text("2500000000\n")
    (v2 / "cpu.stat").write_text("usage_usec 1500000\nuser_usec 1000000\n")
    assert group_cpu(v1) == 2.5
    assert group_cpu(v2) == 1.5


def test_a_workers_collection_is_its_own_scope_not_its_first_tests() -> None:
    rows = [
        {**_row("gw0", COLLECTION, 0, 10), "when": "collect", "group_cpu": 12.0},
        {**_row("gw0", "tests/unit/test_x.py::test_y", 10, 11), "group_cpu": 12.5},
    ]
    text = summary(rows, 5)
    assert "1 tests," in text and "gw0:     1.0 s in tests" in text
    assert f"     12.0  {COLLECTION}\n" in text
    assert "      0.5  tests/unit/test_x.py::test_y" in text
