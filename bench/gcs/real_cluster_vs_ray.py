"""CPU and memory of our GCS vs Ray's own ``gcs_server`` on the same small real cluster.

Same run, same machine, one after the other: (a) ``gcs serve --head`` with two real Ray 2.60
worker nodes (``ray start --address``), (b) Ray's ``ray start --head --num-cpus=0`` (its
``gcs_server``, plus its head raylet and agents, which are not counted) with the same two
workers.  Each cluster runs the same driver (1,000 short tasks, SPREAD, a NodeAffinity
task), then sits idle.  Printed per GCS: nodes that ran tasks, CPU seconds (user+system,
from ``/proc``) during the driver and during the idle window, resident memory at the end and
its peak.  Ratios are ours / Ray's (lower is better for us).

Run (needs the interop venv: ``python -m tests.interop.venvs ray``)::

    .venv/bin/python -m bench.gcs.real_cluster_vs_ray [--idle-s 30] [--tasks 1000]

Numbers taken on a loaded machine are noisy; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from gcs.testing.ports import free_port
from tests.interop import venvs

HOST = "127.0.0.2"
WORKERS = ("127.0.0.2", "127.0.0.3")
DRIVER = """
import sys, time, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], logging_level="ERROR")
@ray.remote(num_cpus=1)
def f(i):
    time.sleep(0.02)
    return ray.get_runtime_context().get_node_id()
n = int(sys.argv[2])
nodes = set(ray.get([f.remote(i) for i in range(n)], timeout=900))
nodes |= set(ray.get([f.options(scheduling_strategy="SPREAD").remote(i) for i in range(20)]))
other = [x["NodeID"] for x in ray.nodes() if x["Alive"] and x["Resources"].get("CPU")]
ray.get(f.options(scheduling_strategy=NodeAffinitySchedulingStrategy(other[-1], soft=False))
        .remote(0), timeout=300)
print(len(nodes))
"""
_TICK = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


def cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in KiB."""
    values = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values["VmRSS"], values["VmHWM"]


@dataclass
class Result:
    name: str
    driver_cpu_s: float
    idle_cpu_s: float
    rss_mib: float
    peak_mib: float
    driver_wall_s: float
    nodes_used: int


class Cluster:
    def __init__(self, name: str, ray_bin: pathlib.Path) -> None:
        self.name = name
        self.ray_bin = ray_bin
        self.port = free_port()
        self.address = f"{HOST}:{self.port}"
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="rayb", dir="/tmp"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.env.update(RAY_USAGE_STATS_ENABLED="0", RAY_DISABLE_DOCKER_CPU_WARNING="1")

    def spawn(self, args: list[str], log: str, env: dict[str, str] | None = None) -> None:
        out = (self.tmp / log).open("wb")
        self.procs.append(
            subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env or self.env,
                start_new_session=True,
            )
        )  # fmt: skip

    def start_workers(self) -> None:
        for i, host in enumerate(WORKERS):
            temp = self.tmp / f"w{i}"
            temp.mkdir()
            self.spawn(
                [
                    str(self.ray_bin), "start", "--address", self.address, "--block",
                    f"--node-ip-address={host}", "--num-cpus=2", f"--temp-dir={temp}",
                ],
                f"worker{i}.log",
            )  # fmt: skip
        deadline = time.monotonic() + 300
        while not all(
            "Ray runtime started" in (self.tmp / f"worker{i}.log").read_text(errors="replace")
            for i in range(len(WORKERS))
        ):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise SystemExit(f"{self.name}: workers did not start; logs in {self.tmp}")
            time.sleep(0.5)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=20)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _pid_of(pattern: str, session: int) -> int:
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if pattern in cmdline and os.getsid(int(entry.name)) == session:
                return int(entry.name)
        except (OSError, ProcessLookupError):
            continue
    raise SystemExit(f"no process matching {pattern!r} in session {session}")


def measure(
    cluster: Cluster, gcs_pid: int, *, python: pathlib.Path, tasks: int, idle_s: float
) -> Result:
    cluster.start_workers()
    time.sleep(5)  # let start-up settle: the windows below measure steady work
    before = cpu_s(gcs_pid)
    start = time.monotonic()
    done = subprocess.run(
        [str(python), "-c", DRIVER, cluster.address, str(tasks)],
        capture_output=True, text=True, env=cluster.env, timeout=1200, check=False,
    )  # fmt: skip
    wall = time.monotonic() - start
    if done.returncode != 0:
        tail = f"{done.stdout[-500:]}\n{done.stderr[-2000:]}"
        raise SystemExit(f"{cluster.name}: driver failed\n{tail}")
    driver_cpu = cpu_s(gcs_pid) - before
    before = cpu_s(gcs_pid)
    time.sleep(idle_s)
    idle_cpu = cpu_s(gcs_pid) - before
    rss, peak = memory_kib(gcs_pid)
    used = int(done.stdout.strip().splitlines()[-1])
    return Result(cluster.name, driver_cpu, idle_cpu, rss / 1024, peak / 1024, wall, used)


Workload = Callable[["Cluster", int], T]
"""(cluster with its GCS started, the GCS's pid) -> what was measured."""


def run_ours(ray_bin: pathlib.Path, workload: Workload[T]) -> T:
    """``workload`` on a cluster headed by ``gcs serve --head`` (memory store)."""
    c = Cluster("ours", ray_bin)
    try:
        c.spawn(
            [
                sys.executable, "-m", "gcs", "serve", "--head", "--host", HOST,
                "--port", str(c.port), "--storage", "memory://", "--metrics-port", "-1",
                "--temp-dir", str(c.tmp / "head"),
            ],
            "gcs.log", env=dict(os.environ),
        )  # fmt: skip
        return workload(c, c.procs[0].pid)
    finally:
        c.stop()


def run_ray(ray_bin: pathlib.Path, workload: Workload[T]) -> T:
    """``workload`` on a cluster headed by Ray's ``ray start --head --num-cpus=0``."""
    c = Cluster("ray", ray_bin)
    try:
        c.spawn(
            [
                str(ray_bin), "start", "--head", "--block", f"--node-ip-address={HOST}",
                f"--port={c.port}", "--num-cpus=0", "--include-dashboard=false",
                f"--temp-dir={c.tmp / 'head'}",
            ],
            "head.log",
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (c.tmp / "head.log").read_text(errors="replace"):
            if time.monotonic() > deadline or c.procs[0].poll() is not None:
                raise SystemExit(f"ray head did not start; logs in {c.tmp}")
            time.sleep(0.5)
        gcs_pid = _pid_of("gcs_server", os.getsid(c.procs[0].pid))
        return workload(c, gcs_pid)
    finally:
        c.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--idle-s", type=float, default=30.0)
    args = parser.parse_args()
    venv = venvs.ensure_venv(venvs.RAY)
    python = pathlib.Path(venv.python)
    ray_bin = python.parent / "ray"
    workload = functools.partial(measure, python=python, tasks=args.tasks, idle_s=args.idle_s)
    results = [run_ours(ray_bin, workload), run_ray(ray_bin, workload)]
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'gcs':6} {'nodes':>5} {'driver s':>9} {'driver cpu s':>13} {'idle cpu s':>11} "
          f"{'rss MiB':>8} {'peak MiB':>9}")  # fmt: skip
    for r in results:
        print(
            f"{r.name:6} {r.nodes_used:5d} {r.driver_wall_s:9.1f} {r.driver_cpu_s:13.2f} "
            f"{r.idle_cpu_s:11.2f} {r.rss_mib:8.1f} {r.peak_mib:9.1f}"
        )
    ours, ray = results
    print(
        f"ratio ours/ray: driver cpu {ours.driver_cpu_s / max(ray.driver_cpu_s, 1e-9):.2f}, "
        f"idle cpu {ours.idle_cpu_s / max(ray.idle_cpu_s, 1e-9):.2f}, "
        f"rss {ours.rss_mib / ray.rss_mib:.2f}"
    )


if __name__ == "__main__":
    main()
