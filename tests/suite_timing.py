"""Where the suite's time goes: a pytest plugin that logs every test phase per worker, and a
summary of such a log (``scripts/test.sh`` says how to run both).

``-p tests.suite_timing`` with ``GCS_SUITE_TIMING=DIR``: each xdist worker appends one JSON
line per phase (setup, call, teardown) to ``DIR/<worker>.jsonl``: node id, start, stop and
the worker's CPU seconds so far (its own and its waited-for children's).
``python -m tests.suite_timing DIR`` prints each worker's sum (the longest is the critical
path: the run's wall time is at least that), the seconds per directory and the slowest scopes
(an interop module runs on one worker, :mod:`tests.interop.xdist_groups`) and tests.

CPU per scope, Ray's processes included: with ``GCS_SUITE_CGROUP`` naming a cgroup directory
the user may create groups in (cgroup v1 ``/sys/fs/cgroup/cpuacct/NAME`` or a v2 one), each
worker moves itself into a group of its own under it, so every process it starts is counted
there (daemonized Ray processes too, reaped or not), and each line carries that group's CPU
seconds (``group_cpu``).  The summary then gives each scope the CPU its worker's group used
from the previous line's end to the end of its own: a module cluster's idle processes are
counted on the worker that started them, while it runs the module's tests.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import resource
import sys
import time
from typing import Any

import pytest

ENV = "GCS_SUITE_TIMING"
CGROUP_ENV = "GCS_SUITE_CGROUP"
_out: pathlib.Path | None = None
_group: pathlib.Path | None = None


def group_cpu(group: pathlib.Path) -> float:
    """CPU seconds of a cgroup and its descendants (v1 cpuacct or v2)."""
    usage = group / "cpuacct.usage"
    if usage.exists():
        return int(usage.read_text()) / 1e9
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


def _join_group(root: pathlib.Path, name: str) -> pathlib.Path:
    group = root / name
    group.mkdir(parents=True, exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    return group


def pytest_configure(config: pytest.Config) -> None:
    global _out, _group, _collected_at
    _collected_at = time.time()
    raw = os.environ.get(ENV)
    # xdist's workers write; its controller only relays their reports
    if raw and (hasattr(config, "workerinput") or config.getoption("dist", "no") == "no"):
        _out = pathlib.Path(raw)
        _out.mkdir(parents=True, exist_ok=True)
        root = os.environ.get(CGROUP_ENV)
        if root:
            _group = _join_group(pathlib.Path(root), os.environ.get("PYTEST_XDIST_WORKER", "main"))


COLLECTION = "<collection>"
"""The line each worker writes when it has collected the suite (what came before it: its
start and collection, its own scope in the summary)."""
_collected_at = 0.0


def pytest_collection_finish(session: pytest.Session) -> None:
    if _out is not None:
        _log(COLLECTION, "collect", _collected_at, time.time())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _out is not None:
        _log(report.nodeid, report.when, report.start, report.stop)


def _log(nodeid: str, when: str, start: float, stop: float) -> None:
    assert _out is not None
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = {
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "id": nodeid,
        "when": when,
        "start": start,
        "stop": stop,
        "cpu": own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime,
    }
    if _group is not None:
        line["group_cpu"] = group_cpu(_group)
    with (_out / f"{line['worker']}.jsonl").open("a") as log:
        log.write(json.dumps(line) + "\n")


def _scope(nodeid: str) -> str:
    from tests.interop.xdist_groups import InteropModuleScheduling

    scheduler = object.__new__(InteropModuleScheduling)  # _split_scope reads no state
    return str(InteropModuleScheduling._split_scope(scheduler, nodeid))


def summary(rows: list[dict[str, Any]], top: int) -> str:
    out = []
    start, stop = min(r["start"] for r in rows), max(r["stop"] for r in rows)
    tests = len({r["id"] for r in rows if r["id"] != COLLECTION})
    out.append(f"{tests} tests, first start to last stop {stop - start:.0f} s")
    by_worker: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        by_worker[row["worker"]].append(row)
    for worker, own in sorted(by_worker.items()):
        busy = sum(r["stop"] - r["start"] for r in own if r["id"] != COLLECTION)
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
    grouped = [r for r in rows if "group_cpu" in r]
    if grouped:
        out += _group_cpu_summary(grouped, top)
    return "\n".join(out)


def _group_cpu_summary(rows: list[dict[str, Any]], top: int) -> list[str]:
    """CPU seconds (:data:`CGROUP_ENV`) per directory and scope: each line gets its worker's
    group's CPU since the worker's previous line (the first: since the group was made)."""
    sums: dict[str, collections.Counter[str]] = {
        "directory": collections.Counter(),
        "scope": collections.Counter(),
    }
    last: dict[str, float] = collections.defaultdict(float)
    for row in sorted(rows, key=lambda r: r["stop"]):
        used = row["group_cpu"] - last[row["worker"]]
        last[row["worker"]] = row["group_cpu"]
        path = row["id"].split("::", 1)[0]
        sums["directory"]["/".join(path.split("/")[:2])] += used
        sums["scope"][_scope(row["id"])] += used
    out = [f"CPU seconds of the workers' cgroups: {sum(last.values()):.1f} in all"]
    for kind, counter in sums.items():
        out.append(f"CPU seconds per {kind} (Ray's processes included):")
        out += [f"  {s:7.1f}  {name}" for name, s in counter.most_common(top)]
    return out


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
