"""The suite's timing log summary (tests/suite_timing.py): each worker's busy seconds (the
longest is the critical path) and the seconds per directory, scope and test."""

from __future__ import annotations

from typing import Any

from tests.suite_timing import summary


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
