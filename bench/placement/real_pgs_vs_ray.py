"""Placement groups on real Ray 2.60 raylets: our GCS against Ray's own ``gcs_server``, same run.

    .venv/bin/python -m bench.placement.real_pgs_vs_ray [--groups 100]

The clusters of :mod:`bench.gcs.clusters` (every port free, logs kept on failure; ours:
``gcs serve --head``; Ray's: ``ray start --head --num-cpus=0``; both with the same two
``ray start --address`` workers of 2 CPUs on 127.0.0.2 / 127.0.0.3).
One driver, after a warm-up group:

* serial: ``--groups`` times, a STRICT_SPREAD group of two ``{"CPU": 0.01}`` bundles is
  created, waited for with ``pg.wait()`` (``WaitPlacementGroupUntilReady``: placement and
  both raylets' prepare / commit, no task), then removed;
* batch: ``--groups`` such groups created at once, all waited for, all removed.

Printed per GCS: p50 / p95 / max of the serial create -> ready latency, the batch's wall
time, and the GCS process's CPU (utime+stime from /proc, sampled by this process while the
driver waits between phases) per group in each phase.  Compare ratios within one run; the
load average is printed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
from dataclasses import dataclass

from bench.gcs.clusters import Cluster, cpu_s, load_average, our_cluster, ray_cluster
from tests.interop import venvs

DRIVER = """
import json, sys, time, ray
from ray.util.placement_group import placement_group, remove_placement_group
ray.init(address=sys.argv[1], logging_level="ERROR")
n = int(sys.argv[2])
SHAPE = [{"CPU": 0.01}, {"CPU": 0.01}]

def step(name):
    print(name, flush=True)
    sys.stdin.readline()

pg = placement_group(SHAPE, strategy="STRICT_SPREAD")
assert pg.wait(timeout_seconds=300)
remove_placement_group(pg)
step("warm")
serial = []
for _ in range(n):
    start = time.perf_counter()
    pg = placement_group(SHAPE, strategy="STRICT_SPREAD")
    assert pg.wait(timeout_seconds=300)
    serial.append(time.perf_counter() - start)
    remove_placement_group(pg)
step("serial")
start = time.perf_counter()
groups = [placement_group(SHAPE, strategy="STRICT_SPREAD") for _ in range(n)]
assert all(pg.wait(timeout_seconds=600) for pg in groups)
batch = time.perf_counter() - start
for pg in groups:
    remove_placement_group(pg)
print(json.dumps({"serial": serial, "batch": batch}), flush=True)
sys.stdin.readline()
"""


@dataclass
class Result:
    name: str
    serial_s: list[float]
    batch_s: float
    serial_cpu_s: float
    batch_cpu_s: float


def workload(cluster: Cluster, *, groups: int) -> Result:
    cluster.start_workers()
    gcs_pid = cluster.gcs_pid
    with (cluster.tmp / "driver.log").open("wb") as errors:
        driver = subprocess.Popen(
            [str(cluster.python), "-c", DRIVER, cluster.address, str(groups)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
            env=cluster.env,
        )  # fmt: skip
    assert driver.stdin is not None and driver.stdout is not None

    def next_phase(expect: str) -> tuple[str, float]:
        """Read the driver's next line (it waits after it); the GCS's CPU seconds then."""
        line = driver.stdout.readline().strip()  # type: ignore[union-attr]
        if not line.startswith(expect):
            driver.kill()
            raise cluster.fail(f"driver said {line!r} (expected {expect!r})")
        return line, cpu_s(gcs_pid)

    def go_on() -> None:
        driver.stdin.write("\n")  # type: ignore[union-attr]
        driver.stdin.flush()  # type: ignore[union-attr]

    _, warm = next_phase("warm")
    go_on()
    _, serial = next_phase("serial")
    go_on()
    line, batch = next_phase("{")
    out = json.loads(line)
    driver.stdin.close()
    driver.wait(timeout=120)
    return Result(cluster.name, out["serial"], out["batch"], serial - warm, batch - serial)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--groups", type=int, default=100)
    args = parser.parse_args()
    python = pathlib.Path(venvs.ensure_venv(venvs.RAY).python)
    print(load_average(), flush=True)
    results = []
    for start in (our_cluster, ray_cluster):
        with start(python) as cluster:
            results.append(workload(cluster, groups=args.groups))
        print(load_average(), flush=True)
    n = args.groups
    print(
        f"{'gcs':5} {'p50 ms':>7} {'p95 ms':>7} {'max ms':>7} {'batch s':>8} "
        f"{'serial cpu ms/pg':>17} {'batch cpu ms/pg':>16}"
    )
    for r in results:
        q = statistics.quantiles(r.serial_s, n=20, method="inclusive")
        print(
            f"{r.name:5} {statistics.median(r.serial_s) * 1e3:7.1f} {q[18] * 1e3:7.1f} "
            f"{max(r.serial_s) * 1e3:7.1f} {r.batch_s:8.2f} {r.serial_cpu_s / n * 1e3:17.2f} "
            f"{r.batch_cpu_s / n * 1e3:16.2f}"
        )
    ours, ray = results
    print(
        f"ratio ours/ray: serial p50 "
        f"{statistics.median(ours.serial_s) / statistics.median(ray.serial_s):.2f}, "
        f"batch wall {ours.batch_s / ray.batch_s:.2f}, "
        f"serial cpu {ours.serial_cpu_s / max(ray.serial_cpu_s, 1e-9):.2f}, "
        f"batch cpu {ours.batch_cpu_s / max(ray.batch_cpu_s, 1e-9):.2f}"
    )


if __name__ == "__main__":
    main()
