"""Simulator speed: one simulated day of a 500-node cluster (target <= 60 s of wall time).

Two workloads: a steady one (500 long-running node-sized tasks) and a bursty one (every 30
minutes 4,000 one-CPU tasks of 10 minutes: ~500 nodes launched, filled and drained 48
times a day).  Busy rounds at 500 nodes run the whole reconciler and scheduler; quiet
rounds are skipped exactly (see gcs/autoscaler/simulator/run.py).  Wall and CPU seconds
are printed with the load average (the machine may be shared: CPU seconds are the steadier
figure).  ``--check-hours H`` also runs H hours of the bursty workload with every round
computed, checks the summary is the same, and prints the speed-up of skipping.

Run: python -m bench.autoscaler.simulate_day [--hours H] [--check-hours H]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from typing import Any

import structlog

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.reconciler import ReconcileConfig
from gcs.autoscaler.simulator import SimResult, parse_workload, simulate, summary

CLUSTER = parse_cluster_config(
    {
        "max_workers": 600,
        "upscaling_speed": 100,
        "idle_timeout_minutes": 5,
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "max_workers": 0},
            "cpu8": {"resources": {"CPU": 8}, "max_workers": 600},
        },
    }
)
CLOUD = {"launch_delay_s": 60, "boot_delay_s": 30, "failure_rate": 0.01, "seed": 1}
WORKLOADS = {
    "steady": {
        "duration": "1d",
        "cloud": CLOUD,
        "tasks": [{"at": 0, "count": 500, "resources": {"CPU": 8}, "duration": "1d"}],
    },
    "bursty": {
        "duration": "1d",
        "cloud": CLOUD,
        "tasks": [
            {"at": 0, "count": 4000, "resources": {"CPU": 1}, "duration": "10m", "every": "30m"},
        ],
    },
}


async def run(name: str, hours: float, skip_quiet: bool = True) -> tuple[SimResult, float, float]:
    raw: dict[str, Any] = {**WORKLOADS[name], "duration": f"{hours}h"}
    wall, cpu = time.perf_counter(), time.process_time()
    result = await simulate(
        CLUSTER,
        parse_workload(raw),
        reconcile=ReconcileConfig(upscaling_speed=100, max_concurrent_launches=100),
        skip_quiet=skip_quiet,
    )
    return result, time.perf_counter() - wall, time.process_time() - cpu


async def main(hours: float, check_hours: float) -> None:
    print(f"simulator: {hours:g} h, 500-node cluster, 5 s rounds (target: 24 h in <= 60 s wall)")
    for name in WORKLOADS:
        result, wall, cpu = await run(name, hours)
        doc = summary(result)
        ran = len(result.samples) - result.skipped_rounds
        print(
            f"  {name:<7} wall {wall:6.1f} s  cpu {cpu:6.1f} s   rounds {len(result.samples)} "
            f"(reconciled {ran}, skipped {result.skipped_rounds}, of which tasks only "
            f"finished {result.skipped_finish_rounds})   peak workers {doc['peak_workers']}   "
            f"node-hours {doc['node_hours']}   load average {os.getloadavg()[0]:.1f}"
        )
    if check_hours > 0:
        fast, _, fast_cpu = await run("bursty", check_hours)
        full, _, full_cpu = await run("bursty", check_hours, skip_quiet=False)
        same = summary(fast) == summary(full) and fast.events == full.events
        print(
            f"  bursty {check_hours:g} h, every round computed: cpu {full_cpu:.1f} s vs "
            f"{fast_cpu:.1f} s skipping ({full_cpu / max(fast_cpu, 1e-9):.1f}x); "
            f"summary and events {'identical' if same else 'DIFFER'}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--check-hours", type=float, default=0.0)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    asyncio.run(main(args.hours, args.check_hours))
