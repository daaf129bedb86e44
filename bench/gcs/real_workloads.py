"""Real Ray 2.60 workloads, our GCS against Ray's own ``gcs_server``: one table, same run.

    .venv/bin/python -m bench.gcs.real_workloads [--runs 3] [--actors 50] [--burst 200]
        [--groups 50] [--pg-burst 100] [--tasks 10000] [--event-reads 20] [--jobs 5]
        [--idle-s 60] [--rows actor,...]

Each run starts one cluster per GCS, ours and Ray's in turn (the order alternates from run
to run): the head (``gcs serve --head --dashboard --head-raylet``, or ``ray start --head``
with its dashboard; both heads with a 0-CPU raylet) and two ``ray start --address`` workers
of 2 CPUs on 127.0.0.2 / 127.0.0.3, every port free (:mod:`bench.gcs.clusters`).  One
driver (Ray 2.60's ``ray[default]``) warms up (an actor, a group, a task) and then runs the
rows; before and after each row this process reads the GCS process's CPU (utime+stime,
``/proc``) and its RSS.  Rows:

* ``actor``: ``--actors`` times create (``num_cpus=0``) -> first method call answered ->
  ``ray.kill``, one after the other;
* ``actor-burst``: ``--burst`` actors created at once, each one's first call awaited, all
  killed; latency is from the burst's start to each actor's first answer;
* ``actor-named``: as ``actor``, each one ``lifetime="detached"`` and named;
* ``pg``: ``--groups`` times a STRICT_SPREAD group of two ``{"CPU": 0.01}`` bundles created,
  ``wait()``-ed for ready, removed;
* ``pg-burst``: ``--pg-burst`` such groups at once, all waited for, all removed;
* ``tasks``: ``--tasks`` tiny tasks (``num_cpus=1``) in batches of 100, task events on
  (Ray's default): the GCS ingests their ``AddTaskEventData``; latency is per batch; the
  row ends 2.5 s after the last batch (the workers' 1 s event flush is in it);
* ``task-events``: ``--event-reads`` ``GetTaskEvents`` calls (the job's tasks, limit 1,000);
* ``job``: ``--jobs`` times ``JobSubmissionClient.submit_job`` (an entrypoint that runs
  ``ray.init()`` and one task) -> status SUCCEEDED, through the dashboard's job API;
* ``idle``: the driver gone, the cluster idle for ``--idle-s`` s; CPU per second.

Each actor/group row waits 1 s after its last kill/remove so the GCS has handled it (that
second's idle CPU is in the row).  Per row the table gives GCS CPU per operation (median
over runs, then min-max), p50 / p99 latency (median over runs), RSS at the row's end, and
the ratio ours / Ray per run (median, min-max); lower is better for us.  The machine is
shared: the load average is printed around each cluster; compare CPU, not wall time.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import select
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from bench.gcs.clusters import (
    STARTUP_TIMED_OUT,
    BenchFailed,
    Cluster,
    cpu_s,
    load_average,
    memory_kib,
    our_cluster,
    ray_cluster,
)
from tests.interop import venvs

ROWS = (
    "actor",
    "actor-burst",
    "actor-named",
    "pg",
    "pg-burst",
    "tasks",
    "task-events",
    "job",
    "idle",
)
UNITS = {"idle": "s"}
"""Operation per row (default: one actor / group / task / call / job)."""

DRIVER = r"""
import json, sys, time, ray
import grpc
from ray.core.generated import gcs_service_pb2 as G, gcs_service_pb2_grpc as GG
from ray.util.placement_group import placement_group, remove_placement_group

address, cfg = sys.argv[1], json.loads(sys.argv[2])
ray.init(address=address, namespace="bench", logging_level="ERROR", log_to_driver=False)

def say(msg):
    print("@@" + json.dumps(msg), flush=True)
    sys.stdin.readline()

@ray.remote(num_cpus=0)
class A:
    def ping(self):
        return 1

@ray.remote(num_cpus=1)
def tiny(i):
    return i

SHAPE = [{"CPU": 0.01}, {"CPU": 0.01}]

def actors(n, named):
    lat = []
    for i in range(n):
        t = time.perf_counter()
        opts = {"name": f"named-{i}", "lifetime": "detached"} if named else {}
        a = A.options(**opts).remote()
        ray.get(a.ping.remote(), timeout=600)
        lat.append(time.perf_counter() - t)
        ray.kill(a)
    time.sleep(1)
    return n, lat

def actor_burst(n):
    t0 = time.perf_counter()
    handles = [A.remote() for _ in range(n)]
    pending = {a.ping.remote(): i for i, a in enumerate(handles)}
    lat = [0.0] * n
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=900)
        if not done:
            raise TimeoutError(f"{len(pending)} actors of the burst not up")
        ray.get(done[0])
        lat[pending.pop(done[0])] = time.perf_counter() - t0
    for a in handles:
        ray.kill(a)
    time.sleep(1)
    return n, lat

def pgs(n):
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        pg = placement_group(SHAPE, strategy="STRICT_SPREAD")
        assert pg.wait(timeout_seconds=600)
        lat.append(time.perf_counter() - t)
        remove_placement_group(pg)
    time.sleep(1)
    return n, lat

def pg_burst(n):
    t0 = time.perf_counter()
    groups = [placement_group(SHAPE, strategy="STRICT_SPREAD") for _ in range(n)]
    lat = []
    for pg in groups:
        assert pg.wait(timeout_seconds=900)
        lat.append(time.perf_counter() - t0)
    for pg in groups:
        remove_placement_group(pg)
    time.sleep(1)
    return n, lat

def tasks(n):
    lat = []
    for start in range(0, n, 100):
        t = time.perf_counter()
        ray.get([tiny.remote(i) for i in range(start, min(n, start + 100))], timeout=900)
        lat.append(time.perf_counter() - t)
    time.sleep(2.5)
    return n, lat

def task_events(n):
    stub = GG.TaskInfoGcsServiceStub(grpc.insecure_channel(address))
    job = bytes.fromhex(ray.get_runtime_context().get_job_id())
    request = G.GetTaskEventsRequest(
        limit=1000,
        filters=G.GetTaskEventsRequest.Filters(
            job_filters=[G.GetTaskEventsRequest.Filters.JobIdFilter(job_id=job)]
        ),
    )
    lat, got = [], 0
    for _ in range(n):
        t = time.perf_counter()
        reply = stub.GetTaskEvents(request, timeout=120)
        lat.append(time.perf_counter() - t)
        got = len(reply.events_by_task)
    if got == 0:
        raise RuntimeError("GetTaskEvents returned no task of the job")
    return n, lat

def jobs(n):
    from ray.job_submission import JobStatus, JobSubmissionClient
    client = JobSubmissionClient(cfg["dashboard"])
    entry = (f"{sys.executable} -c 'import ray; ray.init(); "
             "print(ray.get(ray.remote(lambda: 1).options(num_cpus=0).remote()))'")
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        job = client.submit_job(entrypoint=entry)
        while True:
            status = client.get_job_status(job)
            if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                break
            time.sleep(0.05)
        if status != JobStatus.SUCCEEDED:
            raise RuntimeError(f"job {job}: {status}: {client.get_job_logs(job)[-2000:]}")
        lat.append(time.perf_counter() - t)
    return n, lat

# warm-up: every path once
a = A.remote(); ray.get(a.ping.remote(), timeout=600); ray.kill(a)
pg = placement_group(SHAPE, strategy="STRICT_SPREAD"); assert pg.wait(timeout_seconds=600)
remove_placement_group(pg)
ray.get(tiny.remote(0), timeout=600)
time.sleep(1)

ROWS = {
    "actor": lambda: actors(cfg["actors"], False),
    "actor-burst": lambda: actor_burst(cfg["burst"]),
    "actor-named": lambda: actors(cfg["actors"], True),
    "pg": lambda: pgs(cfg["groups"]),
    "pg-burst": lambda: pg_burst(cfg["pg_burst"]),
    "tasks": lambda: tasks(cfg["tasks"]),
    "task-events": lambda: task_events(cfg["event_reads"]),
    "job": lambda: jobs(cfg["jobs"]),
}
for row in cfg["rows"]:
    if row in ROWS:
        say({"start": row})
        ops, lat = ROWS[row]()
        say({"end": row, "ops": ops, "lat": lat})
print("@@" + json.dumps({"done": True}), flush=True)
"""


@dataclass
class Row:
    cpu_s: float
    ops: int
    latencies_s: list[float]
    rss_mib: float

    @property
    def cpu_ms_per_op(self) -> float:
        return 1000 * self.cpu_s / max(self.ops, 1)

    def latency_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Side:
    name: str
    runs: list[dict[str, Row]] = field(default_factory=list)


def _lines(driver: subprocess.Popen[str], cluster: Cluster, timeout_s: float) -> Iterator[dict]:
    """The driver's ``@@``-marked JSON lines, each within ``timeout_s`` (other output, e.g.
    Ray's, goes to ``driver-stdout.log``)."""
    assert driver.stdout is not None
    other = (cluster.tmp / "driver-stdout.log").open("a")
    while True:
        ready, _, _ = select.select([driver.stdout], [], [], timeout_s)
        if not ready:
            driver.kill()
            raise cluster.fail(f"the driver said nothing for {timeout_s:.0f} s")
        line = driver.stdout.readline()
        if not line:
            driver.wait()
            raise cluster.fail(f"the driver exited with {driver.returncode} (driver.log)")
        if line.startswith("@@"):
            yield json.loads(line[2:])
        else:
            other.write(line)
            other.flush()


def measure(cluster: Cluster, cfg: dict, idle_s: float, timeout_s: float) -> dict[str, Row]:
    cluster.start_workers()
    pid = cluster.gcs_pid
    rows: dict[str, Row] = {}
    with (cluster.tmp / "driver.log").open("w") as errors:
        driver = subprocess.Popen(
            [str(cluster.python), "-c", DRIVER, cluster.address, json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
            env=cluster.env,
        )  # fmt: skip
    assert driver.stdin is not None
    started = 0.0
    try:
        for msg in _lines(driver, cluster, timeout_s):
            if "start" in msg:
                started = cpu_s(pid)
            elif "end" in msg:
                used = cpu_s(pid) - started
                rss = memory_kib(pid)[0] / 1024
                rows[msg["end"]] = Row(used, msg["ops"], msg["lat"], rss)
            else:
                break
            driver.stdin.write("\n")
            driver.stdin.flush()
        driver.wait(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    if "idle" in cfg["rows"]:
        time.sleep(3)  # the driver's exit settles (its job marked finished, workers gone)
        before = cpu_s(pid)
        time.sleep(idle_s)
        rows["idle"] = Row(cpu_s(pid) - before, round(idle_s), [], memory_kib(pid)[0] / 1024)
    return rows


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def _cols(
    pairs: list[tuple[Row, Row]], pick: Callable[[Row], float], width: int, digits: int
) -> str:
    ours_value = _median([pick(o) for o, _ in pairs])
    ray_value = _median([pick(r) for _, r in pairs])
    return f"{ours_value:{width}.{digits}f} {ray_value:{width - 1}.{digits}f}"


def table(ours: Side, ray: Side, rows: list[str]) -> str:
    head = (
        f"{'row':12} {'op':5} {'ours ms/op':>10} {'ray ms/op':>10} {'cpu ratio':>9} "
        f"{'(range)':>11} {'p50 ours':>9} {'p50 ray':>8} {'p99 ours':>9} {'p99 ray':>8} "
        f"{'rss ours':>9} {'rss ray':>8} {'rss ratio':>9}"
    )
    lines = [head, "-" * len(head)]
    for name in rows:
        pairs = [
            (o[name], r[name])
            for o, r in zip(ours.runs, ray.runs, strict=False)
            if name in o and name in r
        ]
        if not pairs:
            continue
        # a window under one clock tick (10 ms) on Ray's side has no ratio
        cpu_ratios = [o.cpu_ms_per_op / r.cpu_ms_per_op for o, r in pairs if r.cpu_s > 0]
        rss_ratios = [o.rss_mib / r.rss_mib for o, r in pairs]

        lines.append(
            f"{name:12} {UNITS.get(name, '1'):5} "
            f"{_cols(pairs, lambda x: x.cpu_ms_per_op, 10, 2)} "
            f"{_median(cpu_ratios):8.2f}x {_span(cpu_ratios):>11} "
            f"{_cols(pairs, lambda x: x.latency_ms(0.5), 9, 1)} "
            f"{_cols(pairs, lambda x: x.latency_ms(0.99), 9, 1)} "
            f"{_cols(pairs, lambda x: x.rss_mib, 9, 1)} {_median(rss_ratios):8.2f}x"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--actors", type=int, default=50)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--groups", type=int, default=50)
    parser.add_argument("--pg-burst", type=int, default=100)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--event-reads", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--idle-s", type=float, default=60.0)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset")
    parser.add_argument("--row-timeout", type=float, default=1800.0, help="s per driver step")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="also write raw rows")
    parser.add_argument(
        "--report", type=pathlib.Path, default=None, help="only print the table of a --json file"
    )
    args = parser.parse_args()
    if args.report is not None:
        raw = json.loads(args.report.read_text())
        loaded = {
            name: Side(name, [{k: Row(**v) for k, v in run.items()} for run in runs])
            for name, runs in raw.items()
        }
        print(table(loaded["ours"], loaded["ray"], list(ROWS)))
        return
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = set(rows) - set(ROWS)
    if unknown:
        parser.error(f"--rows: unknown {sorted(unknown)}; choose from {', '.join(ROWS)}")
    cfg = {
        "rows": rows,
        "actors": args.actors,
        "burst": args.burst,
        "groups": args.groups,
        "pg_burst": args.pg_burst,
        "tasks": args.tasks,
        "event_reads": args.event_reads,
        "jobs": args.jobs,
    }
    python = pathlib.Path(venvs.ensure_venv(venvs.RAY_DEFAULT).python)
    sides = {"ours": Side("ours"), "ray": Side("ray")}
    starts: dict[str, Callable[[], AbstractContextManager[Cluster]]] = {
        "ours": lambda: our_cluster(python, dashboard=True, head_raylet=True),
        "ray": lambda: ray_cluster(python, dashboard=True),
    }
    print(f"config {json.dumps(cfg)} idle {args.idle_s} s; {load_average()}", flush=True)
    for run in range(args.runs):
        order = ("ours", "ray") if run % 2 == 0 else ("ray", "ours")
        for name in order:
            for attempt in (1, 2):
                try:
                    with starts[name]() as cluster:
                        cfg["dashboard"] = cluster.dashboard
                        result = measure(cluster, cfg, args.idle_s, args.row_timeout)
                    break
                except BenchFailed as exc:
                    # Ray's fixed 30 s start-up wait, on a loaded machine: a fresh cluster
                    if attempt == 2 or STARTUP_TIMED_OUT not in str(exc.code):
                        raise
            sides[name].runs.append(result)
            summary = ", ".join(
                f"{k} {v.cpu_ms_per_op:.2f} ms/op p50 {v.latency_ms(0.5):.1f} "
                f"p99 {v.latency_ms(0.99):.1f} rss {v.rss_mib:.1f}"
                for k, v in result.items()
            )
            print(f"run {run + 1} {name}: {summary}; {load_average()}", flush=True)
            if args.json is not None:  # after every cluster: a cut-short run keeps its rows
                _dump(args.json, sides)
    print()
    print(
        f"{args.runs} runs, interleaved; GCS CPU per operation (ms; idle: ms per s), "
        f"latency ms, RSS MiB at the row's end; ratio = ours / Ray"
    )
    print(table(sides["ours"], sides["ray"], rows))
    print(f"at the end: {load_average()}")
    if args.json is not None:
        _dump(args.json, sides)


def _dump(path: pathlib.Path, sides: dict[str, Side]) -> None:
    runs = {name: [{k: vars(v) for k, v in r.items()} for r in s.runs] for name, s in sides.items()}
    path.write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
