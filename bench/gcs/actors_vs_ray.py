"""Actor creation on real Ray 2.60 workers: our GCS against Ray's own ``gcs_server``, same run.

    .venv/bin/python -m bench.gcs.actors_vs_ray [--actors 40] [--servers ours,ray]

For each server a fresh cluster of :mod:`bench.gcs.clusters` on 127.0.0.2 (every port free,
logs kept on failure): Ray's is ``ray start --head --num-cpus=0``, ours ``gcs serve --head``
(memory store); under each one ``ray start --address`` worker node with 4 CPUs.  One driver
then creates ``--actors`` actors one after the other (``num_cpus=0``), times ``.remote()`` ->
first method call answered, and kills each with ``ray.kill``.  Printed per server: p50 / p95 /
max creation latency, actors per second, and the GCS process's CPU (utime+stime from /proc)
over the driver's run, per actor.

Worker start-up (a Python process per actor) dominates the latency on both; the GCS CPU
per actor is the figure that is ours.  The machine is shared: compare within one run; the
load average is printed next to every figure.
"""

from __future__ import annotations

import argparse
import pathlib
import time

from bench.gcs.clusters import (
    HOST,
    Cluster,
    cpu_s,
    last_json,
    load_average,
    our_cluster,
    ray_cluster,
)
from tests.interop import venvs

DRIVER = """
import json, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
@ray.remote(num_cpus=0)
class A:
    def ping(self):
        return 1
lat = []
start = time.perf_counter()
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    a = A.remote()
    ray.get(a.ping.remote(), timeout=300)
    lat.append(time.perf_counter() - t)
    ray.kill(a)
print(json.dumps({"latencies": lat, "wall": time.perf_counter() - start}))
"""


def run_one(cluster: Cluster, actors: int) -> dict[str, float]:
    cluster.start_workers(hosts=(HOST,), num_cpus=4)
    time.sleep(5)  # the node settles (first registration, syncer)
    before = cpu_s(cluster.gcs_pid)
    result = last_json(cluster.driver(DRIVER, str(actors)))
    used = cpu_s(cluster.gcs_pid) - before
    lat = sorted(result["latencies"])
    return {
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p95_ms": 1000 * lat[int(len(lat) * 0.95)],
        "max_ms": 1000 * lat[-1],
        "actors_per_s": len(lat) / result["wall"],
        "gcs_cpu_ms_per_actor": 1000 * used / len(lat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--actors", type=int, default=40)
    parser.add_argument("--servers", default="ours,ray")
    args = parser.parse_args()
    python = pathlib.Path(venvs.ensure_venv(venvs.RAY).python)
    starts = {"ours": our_cluster, "ray": ray_cluster}
    print(f"{args.actors} actors per server; {load_average()}", flush=True)
    rows = {}
    for server in args.servers.split(","):
        if server not in starts:
            parser.error(f"--servers: unknown {server!r}; use ours and/or ray")
        with starts[server](python) as cluster:
            rows[server] = row = run_one(cluster, args.actors)
        print(
            f"{server:>5}: p50 {row['p50_ms']:7.1f} ms  p95 {row['p95_ms']:7.1f} ms  "
            f"max {row['max_ms']:7.1f} ms  {row['actors_per_s']:5.2f} actors/s  "
            f"GCS CPU {row['gcs_cpu_ms_per_actor']:6.2f} ms/actor  ({load_average()})",
            flush=True,
        )
    if "ours" in rows and "ray" in rows:
        ours, ray = rows["ours"], rows["ray"]
        print(
            f"ours / ray: p50 latency {ours['p50_ms'] / ray['p50_ms']:.2f}x, "
            f"GCS CPU per actor {ours['gcs_cpu_ms_per_actor'] / ray['gcs_cpu_ms_per_actor']:.2f}x"
        )


if __name__ == "__main__":
    main()
