"""A sizing model for our GCS: CPU and memory per node, measured with polled raylet fleets and
fitted, projected to 10,000-50,000 nodes (the table in docs/operations.md).

    .venv/bin/python -m bench.gcs.sizing [--nodes 500 1000 2000 4000] [--syncer both]
        [--window 30] [--processes 2]

For each size and each mode (``off``: raylets only polled — ``GetResourceLoad`` every 1 s and
health checks, Ray's defaults; ``on``: each raylet also keeps Ray's syncer stream, its
resource view sent on change and relayed by the GCS to every other raylet), a fresh
``gcs serve`` (memory store, its defaults) and a fleet of raylet agents in ``--processes``
processes (:mod:`bench.gcs.syncer_fleet_vs_ray`: registration, settle, warm-up), then over
``--window`` seconds the GCS's CPU (utime+stime, /proc) and its RSS at the end.  The cluster
is idle (no lease churn): steady-state cost of membership, polling, health and syncer.

Then per mode a least-squares line ``cores = a + b*N`` and ``RSS = c + d*N`` and the
projection to 10k, 20k, 50k nodes.  The fleet shares the same 2 cores: when it cannot
answer every poll the GCS does less work than at full rate, so the achieved poll rate per
node is printed beside each point and the CPU line is fitted only on the points where it
is at least 0.8 x the smallest size's (the others are named).  The machine is shared: the
load average is printed.
"""

from __future__ import annotations

import argparse
import statistics

from bench.gcs.clusters import load_average
from bench.gcs.syncer_fleet_vs_ray import measure, start_ours

PROJECT = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line."""
    if len(xs) < 2:
        return 0.0, ys[0] / xs[0]
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 1000, 2000, 4000])
    parser.add_argument("--syncer", choices=("off", "on", "both"), default="both")
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    modes = ("off", "on") if args.syncer == "both" else (args.syncer,)
    print(f"sizing: nodes {args.nodes}, window {args.window:.0f} s; {load_average()}")
    for mode in modes:
        points: list[tuple[int, dict[str, float]]] = []
        for nodes in args.nodes:
            gcs = start_ours()
            try:
                r = measure(gcs, nodes, args.processes, args.window, 0.0, syncer=mode == "on")
            finally:
                gcs.server.stop()
            points.append((nodes, r))
            print(
                f"  syncer {mode:3} nodes {nodes:5d}: {r['cores']:.3f} cores "
                f"({r['us_per_raylet_s']:.1f} us/node/s), RSS {r['rss_mb']:.0f} MB "
                f"({1024 * r['rss_mb'] / nodes:.1f} KiB/node), GetResourceLoad "
                f"{r['polls_per_s'] / nodes:.2f}/node/s, health checks "
                f"{r['checks_per_s'] / nodes:.2f}/node/s, relayed {r['relayed_per_s']:.0f}/s; "
                f"{load_average()}",
                flush=True,
            )
        xs = [float(n) for n, _ in points]
        # CPU: only the points where the fleet answered (nearly) every poll the GCS wanted,
        # i.e. as many polls per node as at the smallest size; beyond, the fleet (same
        # cores) is the bound and the GCS's CPU understates a real cluster's
        rate0 = points[0][1]["polls_per_s"] / points[0][0]
        kept = [(n, r) for n, r in points if r["polls_per_s"] / n >= 0.8 * rate0]
        left = [n for n, _ in points if n not in {k for k, _ in kept}]
        cores_a, cores_b = fit([float(n) for n, _ in kept], [r["cores"] for _, r in kept])
        rss_a, rss_b = fit(xs, [r["rss_mb"] for _, r in points])
        print(
            f"  syncer {mode}: cores = {cores_a:.4f} + {cores_b * 1e6:.1f}e-6 * N "
            f"(fitted on {[n for n, _ in kept]}; fleet-bound, left out: {left or 'none'}); "
            f"RSS MB = {rss_a:.1f} + {rss_b * 1024:.2f} KiB * N (all points)"
        )
        print(f"  {'nodes':>7} {'cores':>7} {'RSS GB':>7}")
        for n in PROJECT:
            print(f"  {n:7d} {cores_a + cores_b * n:7.2f} {(rss_a + rss_b * n) / 1024:7.2f}")
    print(f"at the end: {load_average()}")


if __name__ == "__main__":
    main()
