"""Measure what a raylet fleet costs while a GCS-like poller drives it (short, bounded).

    python scripts/bench_raylet_fleet.py --count 2000 --seconds 20 [--processes 1]

This process runs a fake GCS (NodeInfo only) and a poller that does what Ray's GCS does to
every alive raylet: GetResourceLoad every 1 s and grpc.health.v1 Check every 3 s.  The
fleet runs as child process(es) via ``python -m gcs.cli.raylet raylet-fleet``.  Reported:
fleet CPU (cores), RSS, fds, threads; poller CPU (a lower bound for a GCS's own cost);
poll latency p50/p99 and errors.  Compare runs by the per-1,000-agent figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gcs.proto import node_manager_pb2
from gcs.raylet.testing import FakeGcs
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import NODE_MANAGER

TICK = os.sysconf("SC_CLK_TCK")


def proc_stats(pids: list[int]) -> tuple[float, float, int, int]:
    """(cpu seconds, rss MB, fds, threads) summed over the processes and their children."""
    cpu = rss = 0.0
    fds = threads = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        cpu += (int(parts[11]) + int(parts[12])) / TICK
        threads += int(parts[17])
        rss += int(parts[21]) * os.sysconf("SC_PAGE_SIZE") / 1e6
        fds += len(os.listdir(f"/proc/{pid}/fd"))
    return cpu, rss, fds, threads


def fleet_pids(root: int) -> list[int]:
    pids = [root]
    try:
        with open(f"/proc/{root}/task/{root}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except FileNotFoundError:
        pass
    return pids


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--distinct-ips", action="store_true")
    args = ap.parse_args()

    gcs = FakeGcs()
    await gcs.start()
    cmd = [sys.executable, "-m", "gcs.cli.raylet", "raylet-fleet", "--address", gcs.address,
           "--count", str(args.count), "--processes", str(args.processes),
           "--resources", '{"CPU": 8, "memory": 1e10}']  # fmt: skip
    if args.distinct_ips:
        cmd.append("--distinct-ips")
    t0 = time.perf_counter()
    child = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.DEVNULL)
    while len(gcs.servicer.registered) < args.count:
        await asyncio.sleep(0.2)
        if child.returncode is not None:
            raise SystemExit("fleet exited early")
    print(f"registered {args.count} raylets in {time.perf_counter() - t0:.1f}s")
    nodes = list(gcs.servicer.registered)
    channels = [
        grpc.aio.insecure_channel(f"{n.node_manager_address}:{n.node_manager_port}") for n in nodes
    ]
    loads = [ServiceStub(c, NODE_MANAGER, timeout_s=10) for c in channels]
    healths = [health_pb2_grpc.HealthStub(c) for c in channels]
    pids = fleet_pids(child.pid)
    idle0, _, _, _ = proc_stats(pids)
    await asyncio.sleep(3)
    idle1, rss_idle, _, _ = proc_stats(pids)

    latencies: list[float] = []
    errors = 0

    async def one(coro: object) -> None:
        nonlocal errors
        start = time.perf_counter()
        try:
            await coro  # type: ignore[misc]
            latencies.append(time.perf_counter() - start)
        except grpc.aio.AioRpcError:
            errors += 1

    async def round_(i: int) -> None:
        calls = [one(s.GetResourceLoad(node_manager_pb2.GetResourceLoadRequest())) for s in loads]
        if i % 3 == 0:
            calls += [
                one(h.Check(health_pb2.HealthCheckRequest(service=n.node_id.hex()), timeout=10))
                for h, n in zip(healths, nodes, strict=True)
            ]
        await asyncio.gather(*calls)

    await round_(0)  # connect every channel before measuring
    latencies.clear()
    c0, _, _, _ = proc_stats(pids)
    me0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    tasks = []
    i = 0
    while time.perf_counter() - start < args.seconds:
        tasks.append(asyncio.ensure_future(round_(i)))
        i += 1
        await asyncio.sleep(max(0.0, start + i - time.perf_counter()))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    c1, rss, fds, threads = proc_stats(pids)
    me1 = resource.getrusage(resource.RUSAGE_SELF)
    mine = (me1.ru_utime + me1.ru_stime) - (me0.ru_utime + me0.ru_stime)
    per_k = 1000 / args.count
    fleet_cpu = (c1 - c0) / wall
    latencies.sort()
    print(f"fleet idle cpu: {(idle1 - idle0) / 3:.3f} cores, rss idle {rss_idle:.0f} MB")
    print(
        f"fleet under polling: cpu {fleet_cpu:.2f} cores ({fleet_cpu * per_k:.2f}/1k agents), "
        f"rss {rss:.0f} MB ({rss * per_k:.0f} MB/1k), fds {fds}, threads {threads}"
    )
    print(f"rpcs {len(latencies)} in {wall:.1f}s ({len(latencies) / wall:.0f}/s), errors {errors}")
    print(
        f"latency p50 {statistics.median(latencies) * 1000:.1f} ms, "
        f"p99 {latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms"
    )
    print(f"poller (GCS-side) cpu {mine / wall:.2f} cores")
    child.terminate()
    await child.wait()
    await asyncio.gather(*(c.close() for c in channels))
    await gcs.stop()


if __name__ == "__main__":
    asyncio.run(main())
