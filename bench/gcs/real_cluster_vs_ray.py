"""CPU and memory of our GCS vs Ray's own ``gcs_server`` on the same small real cluster.

Same run, same machine, one after the other: (a) ``gcs serve --head`` with two real Ray 2.60
worker nodes (``ray start --address``), (b) Ray's ``ray start --head --num-cpus=0`` (its
``gcs_server``, plus its head raylet and agents, which are not counted) with the same two
workers.  Each cluster runs the same driver (1,000 short tasks, SPREAD, a NodeAffinity
task), then sits idle.  Printed per GCS: nodes that ran tasks, CPU seconds (user+system,
from ``/proc``) during the driver and during the idle window, resident memory at the end and
its peak.  Ratios are ours / Ray's (lower is better for us).

Every port is chosen free and logs are kept on failure (:mod:`bench.gcs.clusters`).

Run (needs the interop venv: ``python -m tests.interop.venvs ray``)::

    .venv/bin/python -m bench.gcs.real_cluster_vs_ray [--idle-s 30] [--tasks 1000]

Numbers taken on a loaded machine are noisy; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import time
from dataclasses import dataclass

from bench.gcs.clusters import (
    Cluster,
    cpu_s,
    load_average,
    memory_kib,
    our_cluster,
    ray_cluster,
)
from tests.interop import venvs

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


@dataclass
class Result:
    name: str
    driver_cpu_s: float
    idle_cpu_s: float
    rss_mib: float
    peak_mib: float
    driver_wall_s: float
    nodes_used: int


def measure(cluster: Cluster, *, tasks: int, idle_s: float) -> Result:
    cluster.start_workers()
    time.sleep(5)  # let start-up settle: the windows below measure steady work
    pid = cluster.gcs_pid
    before = cpu_s(pid)
    start = time.monotonic()
    out = cluster.driver(DRIVER, str(tasks), timeout_s=1200)
    wall = time.monotonic() - start
    driver_cpu = cpu_s(pid) - before
    before = cpu_s(pid)
    time.sleep(idle_s)
    idle_cpu = cpu_s(pid) - before
    rss, peak = memory_kib(pid)
    used = int(out.strip().splitlines()[-1])
    return Result(cluster.name, driver_cpu, idle_cpu, rss / 1024, peak / 1024, wall, used)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--idle-s", type=float, default=30.0)
    args = parser.parse_args()
    python = pathlib.Path(venvs.ensure_venv(venvs.RAY).python)
    workload = functools.partial(measure, tasks=args.tasks, idle_s=args.idle_s)
    print(load_average(), flush=True)
    results = []
    for start in (our_cluster, ray_cluster):
        with start(python) as cluster:
            results.append(workload(cluster))
        print(load_average(), flush=True)
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
    print(f"at the end: {load_average()}")


if __name__ == "__main__":
    main()
