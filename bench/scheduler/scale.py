"""Scheduler at 10,000 nodes and 100,000 pending requests (target <= 1 s), and a
pathological round (100,000 distinct request shapes) bounded by the per-round work caps.

Run: python bench/scheduler/scale.py
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import scenario  # noqa: E402

from gcs.policy.autoscaling.scheduler import schedule  # noqa: E402
from gcs.policy.autoscaling.scheduler.types import ResourceDemand  # noqa: E402
from tests.autoscaler.scenario_io import scenario_input  # noqa: E402


def big(times: int) -> dict:  # type: ignore[type-arg]
    sc = scenario(1)
    for n in sc["existing_nodes"]:
        if "count" in n:
            n["count"] *= times
    for r in sc["resource_requests"]:
        r["count"] *= times
    sc["max_num_nodes"] = 3001 * times
    for t in sc["node_types"].values():
        t["max_workers"] *= times
    return sc


def timed(inp) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    reply = schedule(inp)
    return time.perf_counter() - t0, reply


def main() -> None:
    inp = scenario_input(big(10))
    pending = sum(d.count for d in inp.demands)
    wall, reply = timed(inp)
    print(f"10x big case: {len(inp.instances)} nodes, {pending} pending requests "
          f"in {len(inp.demands)} shapes")  # fmt: skip
    print(f"  wall {wall:.3f} s (target <= 1 s)   launches {dict(reply.launches)}")  # type: ignore[attr-defined]
    shapes = tuple(
        ResourceDemand({"CPU": 1 + (i % 997) / 1000, f"r{i % 50}": 0.001}, 1)
        for i in range(100_000)
    )
    wild = replace(inp, demands=shapes)
    wall, reply = timed(wild)
    deferred = [d.reason for d in reply.reasons if d.action == "deferred"]  # type: ignore[attr-defined]
    print(f"pathological: 10,000 nodes, 100,000 distinct shapes, default work cap: "
          f"wall {wall:.2f} s; {deferred[0] if deferred else 'nothing deferred'}")  # fmt: skip


if __name__ == "__main__":
    main()
