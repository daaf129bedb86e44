"""Simulator speed: one simulated day of a 500-node cluster (target <= 60 s of wall time).

Two workloads: a steady one (500 long-running node-sized tasks) and a bursty one (four
bursts a day that each need ~500 nodes for 30 minutes, then scale back down), so both
quiet and busy rounds are measured.  Busy rounds at 500 nodes cost ~50-100 ms each (the
whole reconciler and scheduler run); quiet rounds are skipped exactly (see
gcs/autoscaler/simulator/run.py).  ``--hours`` shortens the day for a quick look.

Run: python -m bench.autoscaler.simulate_day
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

import structlog

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.reconciler import ReconcileConfig
from gcs.autoscaler.simulator import parse_workload, simulate, summary

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


async def main(hours: float) -> None:
    print(f"simulator: {hours:g} h, 500-node cluster, 5 s rounds (target: 24 h in <= 60 s wall)")
    for name, raw in WORKLOADS.items():
        t0 = time.perf_counter()
        result = await simulate(
            CLUSTER,
            parse_workload({**raw, "duration": f"{hours}h"}),
            reconcile=ReconcileConfig(upscaling_speed=100, max_concurrent_launches=100),
        )
        wall = time.perf_counter() - t0
        doc = summary(result)
        ran = len(result.samples) - result.skipped_rounds
        print(
            f"  {name:<7} wall {wall:6.1f} s   rounds {len(result.samples)} "
            f"(reconciled {ran}, skipped quiet {result.skipped_rounds})   "
            f"peak workers {doc['peak_workers']}   node-hours {doc['node_hours']}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--hours", type=float, default=24.0)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    asyncio.run(main(args.hours))
