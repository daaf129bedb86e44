"""Scheduler benchmark: the big case (1 head + 950 running + 50 requested, 10,000 requests)
and a quarter of it. Prints wall time, peak traced memory, growth ratio and, when a
ray==2.60.0 virtualenv exists at ~/.cache/gcs-interop/ray-2.60.0, Ray's time on the same input.

Run: python bench/scheduler/run.py [--skip-ray] [--repeat N]
Compare runs by wall time and the decisions line (launches/infeasible must not change).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import scenario  # noqa: E402

from gcs.policy.autoscaling.scheduler import schedule  # noqa: E402
from tests.autoscaler.scenario_io import our_decisions, scenario_input  # noqa: E402

RAY_PY = Path.home() / ".cache/gcs-interop/ray-2.60.0/bin/python"


def time_ours(div: int, repeat: int) -> tuple[float, float, dict]:
    inp = scenario_input(scenario(div))
    best = float("inf")
    reply = None
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        reply = schedule(inp)
        best = min(best, time.perf_counter() - t0)
    tracemalloc.start()
    schedule(inp)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert reply is not None
    return best, peak / 1e6, our_decisions(reply)


def time_ray(div: int, timeout_s: float) -> tuple[float, dict] | None:
    script = Path(__file__).resolve().parent / "ray_side.py"
    try:
        out = subprocess.run(
            [str(RAY_PY), str(script)],
            input=json.dumps(scenario(div)),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"  ray run failed: {exc}")
        return None
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res["seconds"], res["launch"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ray-timeout", type=float, default=400.0)
    args = ap.parse_args()
    rss_before = _rss_mb()
    q_s, q_mb, q_dec = time_ours(4, args.repeat)
    b_s, b_mb, b_dec = time_ours(1, args.repeat)
    print(f"quarter: {q_s:.4f} s  peak traced {q_mb:.1f} MB  launch {q_dec['launch']}")
    print(f"big:     {b_s:.4f} s  peak traced {b_mb:.1f} MB  launch {b_dec['launch']}")
    print(f"big infeasible: {b_dec['infeasible']}")
    print(f"growth big/quarter: {b_s / q_s:.2f}x for 4x input (linear = 4, quadratic = 16)")
    print(f"process max RSS: {_rss_mb():.0f} MB (was {rss_before:.0f} MB before the runs)")
    print(f"target big <= 0.5 s: {'PASS' if b_s <= 0.5 else 'FAIL'}")
    if args.skip_ray or not RAY_PY.exists() or os.environ.get("CI"):
        print("ray 2.60.0: skipped (no virtualenv at ~/.cache/gcs-interop/ray-2.60.0 or skipped)")
        return
    for div, name, ours in ((4, "quarter", q_s), (1, "big", b_s)):
        res = time_ray(div, args.ray_timeout)
        if res is None:
            continue
        secs, launch = res
        print(f"ray {name}: {secs:.2f} s  launch {launch}  ratio ray/ours {secs / ours:.0f}x")


def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    main()
