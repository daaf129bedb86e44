"""GetClusterResourceState latency while 2,000 fleet raylets are polled (issue 12 item 7:
p99 <= 50 ms at 2,000 raylets polled at 1 s).

Three processes: the GCS (this module with ``--serve``: ``GcsServer`` with the memory store
and the defaults of ``gcs serve``, i.e. Ray's poll and health-check periods, plus a loop-lag
probe and GC timing), the raylet fleet (``gcs raylet-fleet``, its own processes), and this
one, which reads ``GetClusterResourceState`` with our client every ``--interval`` seconds
once every node has registered and a warm-up has passed.

    python -m bench.gcs.state_under_poll [--nodes 2000] [--seconds 40] [--profile-loop]

Prints read latency p50/p99/max, the GCS event loop's lag (a task sleeping 5 ms measures how
late it wakes: the time something else held the loop), cyclic-GC pauses by generation, and
the GCS's CPU per poll over the window.  ``--profile-loop`` times every callback the GCS loop runs
and prints what the loop iterations longer than 10 ms spent their time on (the profile of the
tail; it costs some CPU, so measure latency without it).  ``--cprofile N`` runs cProfile in the
GCS over the window and prints its N most expensive functions by own time and by cumulative
time (where the CPU goes; it roughly doubles the GCS's CPU, so latency figures of such a run
mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import gc
import io
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import grpc

from gcs.proto import autoscaler_pb2 as A
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import AUTOSCALER_STATE, NODE_INFO
from gcs.testing.ports import free_port

_TICKS = os.sysconf("SC_CLK_TCK")
_PROBE_S = 0.005
_STALL_S = 0.010


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    return (int(fields[11]) + int(fields[12])) / _TICKS


# -- the GCS side -------------------------------------------------------------------------------
class LoopProbe:
    """Loop lag, GC pauses and (optionally) what long loop iterations ran."""

    def __init__(self, profile_loop: bool) -> None:
        self.lags_ms: list[float] = []
        self.gc_ms: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.slow_ms: collections.Counter[str] = collections.Counter()
        self.slow_counts: collections.Counter[str] = collections.Counter()
        self.iteration_cpu_ms: list[float] = []
        """CPU time of the loop iterations that took over 1 ms of it."""
        self.iterations = 0
        self._gc_start = 0.0
        self._sample = profile_loop
        gc.callbacks.append(self._on_gc)

    def reset(self) -> None:
        self.lags_ms.clear()
        for pauses in self.gc_ms.values():
            pauses.clear()
        self.slow_ms.clear()
        self.slow_counts.clear()
        self.iteration_cpu_ms.clear()
        self.iterations = 0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_start = time.thread_time()
        else:
            self.gc_ms[info["generation"]].append((time.thread_time() - self._gc_start) * 1000)

    async def run(self) -> None:
        self._time_iterations()
        while True:
            before = time.perf_counter()
            await asyncio.sleep(_PROBE_S)
            self.lags_ms.append(max(0.0, (time.perf_counter() - before - _PROBE_S) * 1000))

    def _time_iterations(self) -> None:
        """CPU time of every loop iteration (load-independent: what holding the loop costs);
        with ``profile_loop`` also what the iterations over 10 ms CPU ran, callback by
        callback."""
        loop = asyncio.get_running_loop()
        run_once = loop._run_once  # type: ignore[attr-defined]
        handle_run = asyncio.events.Handle._run
        current: collections.Counter[str] = collections.Counter()
        counts: collections.Counter[str] = collections.Counter()
        slow_ms, slow = self.slow_ms, self.slow_counts
        cpu_ms = self.iteration_cpu_ms
        thread_time = time.thread_time

        def label(handle: asyncio.Handle) -> str:
            callback = handle._callback  # type: ignore[attr-defined]
            owner = getattr(callback, "__self__", None)
            if isinstance(owner, asyncio.Task):
                coro = owner.get_coro()
                frame = getattr(coro, "cr_frame", None)
                where = f" line {frame.f_lineno}" if frame is not None else ""
                return f"task {coro.__qualname__}{where}"  # type: ignore[union-attr]
            if owner is not None:
                return f"{type(owner).__name__}.{callback.__name__}"
            return getattr(callback, "__qualname__", repr(callback))

        def timed_run(handle: asyncio.Handle) -> None:
            key = label(handle)  # before running: a task's label names where it resumes
            t0 = thread_time()
            handle_run(handle)
            current[key] += (thread_time() - t0) * 1000
            counts[key] += 1

        def timed_run_once() -> None:
            current.clear()
            counts.clear()
            t0 = thread_time()
            run_once()
            spent = (thread_time() - t0) * 1000
            self.iterations += 1
            if spent > 1.0:
                cpu_ms.append(spent)
            if spent > _STALL_S * 1000:
                for key, ms in current.items():
                    slow_ms[key] += ms
                    slow[key] += counts[key]

        if self._sample:
            asyncio.events.Handle._run = timed_run  # type: ignore[method-assign]
        loop._run_once = timed_run_once  # type: ignore[attr-defined]

    def summary(self) -> dict[str, Any]:
        lags = self.lags_ms
        return {
            "lag_ms": {
                "n": len(lags),
                "p50": percentile(lags, 0.5),
                "p99": percentile(lags, 0.99),
                "p999": percentile(lags, 0.999),
                "max": max(lags, default=0.0),
                "over_20": sum(1 for v in lags if v > 20),
                "over_50": sum(1 for v in lags if v > 50),
            },
            "gc_ms": {
                str(g): {"n": len(p), "total": sum(p), "max": max(p, default=0.0)}
                for g, p in self.gc_ms.items()
            },
            "iterations": {
                "n": self.iterations,
                "cpu_ms_over_1": sorted(self.iteration_cpu_ms)[-2000:],
            },
            "slow_contents": [
                [name, ms, self.slow_counts[name]] for name, ms in self.slow_ms.most_common(12)
            ],
        }


async def serve(port: int, stats_path: str, profile_loop: bool, cprofile: bool) -> None:
    from gcs.config import load_config
    from gcs.server import GcsServer
    from gcs.server.logging import configure_logging

    config = load_config(
        flags={"port": port, "storage": "memory://", "metrics_port": -1, "log_level": "warning"}
    )
    configure_logging("json", "warning")
    server = GcsServer(config)
    await server.start()
    assert server.managers is not None
    poller = server.managers.poller
    probe = LoopProbe(profile_loop)
    loop = asyncio.get_running_loop()
    probe_task = loop.create_task(probe.run())
    window: dict[str, Any] = {}
    stop = asyncio.Event()
    profiler = cProfile.Profile() if cprofile else None

    def begin() -> None:
        window["startup_gc"] = probe.summary()["gc_ms"]  # type: ignore[assignment]
        probe.reset()
        window.update(polls=poller.stats.polls_ok, cpu=time.process_time(), t=time.monotonic())
        if profiler is not None:
            profiler.enable()

    def dump() -> None:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(stats_path + ".prof")
        out = probe.summary()
        seconds = time.monotonic() - window["t"]
        polls = poller.stats.polls_ok - window["polls"]
        cpu = time.process_time() - window["cpu"]
        out["startup_gc"] = window["startup_gc"]
        out["window"] = {
            "seconds": seconds,
            "polls_per_s": polls / seconds,
            "cores": cpu / seconds,
            "cpu_us_per_poll": 1e6 * cpu / max(polls, 1),
            "last_round_s": poller.stats.last_round_s,
            "alive": len(server.managers.nodes.alive),
        }
        kinds = collections.Counter(type(o).__name__ for o in gc.get_objects())
        t0 = time.thread_time()
        gc.collect()
        out["full_gc"] = {
            "ms": (time.thread_time() - t0) * 1000,
            "kinds": kinds.most_common(25),
            "tracked": len(gc.get_objects()),
            "frozen": gc.get_freeze_count(),
            "threshold": gc.get_threshold(),
            "reclaims": getattr(getattr(server, "gc_freezer", None), "reclaims", 0),
        }
        with open(stats_path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(stats_path + ".tmp", stats_path)

    loop.add_signal_handler(signal.SIGUSR1, begin)
    loop.add_signal_handler(signal.SIGUSR2, dump)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(f"READY {server.address}", flush=True)
    await stop.wait()
    probe_task.cancel()
    await server.stop()


# -- the reader side ----------------------------------------------------------------------------
async def alive_count(stub: ServiceStub) -> int:
    reply = await stub.GetAllNodeInfo(G.GetAllNodeInfoRequest())
    return sum(1 for n in reply.node_info_list if n.state == n.ALIVE)


async def measure(
    address: str, gcs: subprocess.Popen[bytes], args: argparse.Namespace
) -> tuple[list[float], int]:
    """Wait for the fleet, then read for ``args.seconds``; the GCS's window spans the reads."""
    async with grpc.aio.insecure_channel(address) as ch:
        cid = (await ServiceStub(ch, NODE_INFO).GetClusterId(G.GetClusterIdRequest())).cluster_id
        md = [("ray_cluster_id", cid.hex())]
        nodes = ServiceStub(ch, NODE_INFO, metadata=md, timeout_s=30)
        state = ServiceStub(ch, AUTOSCALER_STATE, metadata=md, timeout_s=30)
        deadline = time.monotonic() + 240
        while (alive := await alive_count(nodes)) < args.nodes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {alive} of {args.nodes} registered")
            await asyncio.sleep(1)
        await asyncio.sleep(args.warmup)
        gcs.send_signal(signal.SIGUSR1)
        await asyncio.sleep(0.2)
        times: list[float] = []
        size = 0
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            reply = await state.GetClusterResourceState(A.GetClusterResourceStateRequest())
            times.append((time.perf_counter() - t0) * 1000)
            size = reply.ByteSize()
            await asyncio.sleep(args.interval)
        gcs.send_signal(signal.SIGUSR2)
    return times, size


def print_profile(path: str, top: int) -> None:
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        stats = pstats.Stats(path, stream=out)
        stats.sort_stats(order).print_stats(top)
        print(f"GCS cProfile over the window, by {order}:")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[-6000:])


def read(args: argparse.Namespace) -> None:
    port = free_port()
    stats = tempfile.NamedTemporaryFile(suffix=".json", delete=False)  # noqa: SIM115
    stats.close()
    server_cmd = [sys.executable, "-m", "bench.gcs.state_under_poll", "--serve", str(port)]
    server_cmd += ["--stats", stats.name] + (["--profile-loop"] if args.profile_loop else [])
    server_cmd += ["--cprofile", str(args.cprofile)] if args.cprofile else []
    gcs = subprocess.Popen(server_cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    fleet = None
    try:
        assert gcs.stdout is not None
        line = gcs.stdout.readline().decode()
        if not line.startswith("READY"):
            raise RuntimeError(f"GCS did not start: {line!r}")
        address = line.split()[1]
        fleet = subprocess.Popen(
            [
                *(sys.executable, "-m", "gcs.cli.main", "raylet-fleet", "--gcs-address", address),
                *("--count", str(args.nodes), "--processes", str(args.processes)),
                *("--resources", '{"CPU": 4}', "--node-type", "cpu4"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        times, size = asyncio.run(measure(address, gcs, args))
        for _ in range(300):  # the GCS writes its figures on SIGUSR2
            if os.path.getsize(stats.name):
                break
            time.sleep(0.1)
        with open(stats.name) as f:
            server = json.load(f)
        if args.cprofile:
            print_profile(stats.name + ".prof", args.cprofile)
    finally:
        for proc in (fleet, gcs):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        os.unlink(stats.name)
        if os.path.exists(stats.name + ".prof"):
            os.unlink(stats.name + ".prof")
    w, lag = server["window"], server["lag_ms"]
    print(
        f"nodes={args.nodes} alive={w['alive']} reply_bytes={size} reads={len(times)}: "
        f"GetClusterResourceState p50={statistics.median(times):.1f} ms "
        f"p99={percentile(times, 0.99):.1f} ms max={max(times):.1f} ms (target p99<=50 ms)"
    )
    print(
        f"GCS loop lag (5 ms probe, n={lag['n']}): p50={lag['p50']:.1f} p99={lag['p99']:.1f} "
        f"p99.9={lag['p999']:.1f} max={lag['max']:.1f} ms; >20 ms {lag['over_20']}x, "
        f">50 ms {lag['over_50']}x"
    )
    print(
        "GC pauses (CPU): "
        + "; ".join(
            f"gen{g} n={v['n']} total={v['total']:.0f} ms max={v['max']:.1f} ms"
            for g, v in server["gc_ms"].items()
        )
    )
    print(
        "GC pauses (CPU) while the fleet registered: "
        + "; ".join(
            f"gen{g} n={v['n']} total={v['total']:.0f} ms max={v['max']:.1f} ms"
            for g, v in server["startup_gc"].items()
        )
    )
    full = server["full_gc"]
    print(
        f"a full collection now: {full['ms']:.1f} ms CPU over {full['tracked']} tracked objects "
        f"({full['frozen']} frozen; thresholds {full['threshold']}; "
        f"{full['reclaims']} reclaims of frozen cycles since start)"
    )
    print(
        f"GCS {w['cores']:.2f} cores, {w['polls_per_s']:.0f} polls/s, "
        f"{w['cpu_us_per_poll']:.0f} us CPU per poll (incl. health checks and reads), "
        f"last poll round {w['last_round_s']:.2f} s"
    )
    if args.profile_loop:
        print("tracked objects by type:", full["kinds"])
    it = server["iterations"]
    big = it["cpu_ms_over_1"]
    print(
        f"GCS loop iterations by CPU time (n={it['n']}, load-independent): "
        + ", ".join(f">{t} ms {sum(1 for v in big if v > t)}x" for t in (5, 10, 20, 50))
        + f", longest {max(big, default=0.0):.1f} ms"
    )
    if args.profile_loop:
        print("what the iterations over 10 ms CPU ran (CPU ms, callbacks):")
        for name, ms, count in server["slow_contents"]:
            print(f"    {ms:8.0f} ms {count:7d}x  {name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--profile-loop", action="store_true")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stats", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        asyncio.run(serve(args.serve, args.stats, args.profile_loop, bool(args.cprofile)))
    else:
        read(args)
