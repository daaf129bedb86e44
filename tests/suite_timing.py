"""Where the suite's time goes: a pytest plugin that logs every test phase per worker, and a
summary of such a log (``scripts/test.sh`` says how to run both).

``-p tests.suite_timing`` with ``GCS_SUITE_TIMING=DIR``: each xdist worker appends one JSON
line per phase (setup, call, teardown) to ``DIR/<worker>.jsonl``: node id, start, stop and
the worker's CPU seconds so far (its own and its waited-for children's).
``python -m tests.suite_timing DIR`` prints each worker's sum (the longest is the critical
path: the run's wall time is at least that), the seconds per directory and the slowest scopes
(an interop module runs on one worker, :mod:`tests.interop.xdist_groups`) and tests.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import resource
import sys
from typing import Any

import pytest

ENV = "GCS_SUITE_TIMING"
_out: pathlib.Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _out
    raw = os.environ.get(ENV)
    # xdist's workers write; its controller only relays their reports
    if raw and (hasattr(config, "workerinput") or config.getoption("dist", "no") == "no"):
        _out = pathlib.Path(raw)
        _out.mkdir(parents=True, exist_ok=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _out is None:
        return
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = {
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "id": report.nodeid,
        "when": report.when,
        "start": report.start,
        "stop": report.stop,
        "cpu": own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime,
    }
    with (_out / f"{line['worker']}.jsonl").open("a") as log:
        log.write(json.dumps(line) + "\n")


def _scope(nodeid: str) -> str:
    from tests.interop.xdist_groups import InteropModuleScheduling

    scheduler = object.__new__(InteropModuleScheduling)  # _split_scope reads no state
    return str(InteropModuleScheduling._split_scope(scheduler, nodeid))


def summary(rows: list[dict[str, Any]], top: int) -> str:
    out = []
    start, stop = min(r["start"] for r in rows), max(r["stop"] for r in rows)
    tests = len({r["id"] for r in rows})
    out.append(f"{tests} tests, first start to last stop {stop - start:.0f} s")
    by_worker: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        by_worker[row["worker"]].append(row)
    for worker, own in sorted(by_worker.items()):
        busy = sum(r["stop"] - r["start"] for r in own)
        cpu = max(r["cpu"] for r in own)
        out.append(f"  {worker}: {busy:7.1f} s in tests, {cpu:6.1f} CPU s (and waited children)")
    sums: dict[str, collections.Counter[str]] = {
        "directory": collections.Counter(),
        "scope": collections.Counter(),
        "test": collections.Counter(),
    }
    for row in rows:
        seconds = row["stop"] - row["start"]
        path = row["id"].split("::", 1)[0]
        sums["directory"]["/".join(path.split("/")[:2])] += seconds
        sums["scope"][_scope(row["id"])] += seconds
        sums["test"][row["id"]] += seconds
    for kind, counter in sums.items():
        out.append(f"seconds per {kind} (setup + call + teardown):")
        out += [f"  {s:7.1f}  {name}" for name, s in counter.most_common(top)]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if not argv:
        print(f"usage: python -m tests.suite_timing DIR [TOP]  (DIR: {ENV} of a run)")
        return 2
    rows = [json.loads(line) for path in pathlib.Path(argv[0]).glob("*.jsonl") for line in
            path.read_text().splitlines()]  # fmt: skip
    print(summary(rows, int(argv[1]) if len(argv) > 1 else 15))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
