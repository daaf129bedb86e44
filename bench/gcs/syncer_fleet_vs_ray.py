"""GCS CPU per raylet: syncer-speaking fleet, our ``gcs serve`` against Ray 2.60's ``gcs_server``.

    python -m bench.gcs.syncer_fleet_vs_ray [--nodes 2000] [--processes 2] [--window 30]
        [--change-interval 0] [--servers ours,ray] [--rounds 1]

The same fleet (``gcs.raylet.fleet``: one grpc.aio server per raylet, each registering,
answering GetResourceLoad and health checks, and keeping Ray's syncer stream — its
RESOURCE_VIEW right after connecting and then only on change, reading every view the GCS
relays) runs in ``--processes`` processes against each GCS in turn, in the same run.  Both
GCSs keep their defaults (Ray: GetResourceLoad every 1 s, health checks every 3 s unless a
syncer message came in; ours: the same periods, with adaptive polling — a raylet whose
syncer view did not change and that had no pending demand is polled every
``load_poll.syncer_max_staleness_ms``, 2 s, and the poll reply is its heartbeat).

``--change-interval S`` makes every raylet change its view about every S seconds (a lease
of 1 CPU taken or given back, at random times): each change is one RESOURCE_VIEW to the GCS
and one relay to each other raylet, so the GCS's syncer work grows with nodes².  0 (the
default) is an idle cluster, where only the polls and health checks remain.

After every raylet has registered and opened its stream and a warm-up (Ray's first health
checks start 5 s after registration), over ``--window`` seconds it prints, per GCS:
GCS CPU per raylet per second (utime+stime from /proc, load-independent), GCS cores, RSS,
GetResourceLoad calls and health checks per second answered by the fleet (and the GCS CPU
per such RPC: on a loaded machine the fleet may answer fewer polls than a GCS wants, which
lowers that GCS's CPU per raylet), syncer messages relayed to the fleet per second, and
the staleness of the GCS's load view — the age of the oldest GetResourceLoad answered by
any raylet (measured at the raylets, so the same for both GCSs; resources, idle
and draining travel on the syncer and are fresh for both).  Then the ratio Ray / ours.
The machine is shared: the load average is printed; compare CPU time, not wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.gcs.poll_fleet import cpu_seconds, scrape  # noqa: E402
from bench.pubsub.vs_ray import Server, ray_gcs_server_binary  # noqa: E402
from bench.pubsub.vs_ray import start_ray as start_ray_server  # noqa: E402
from gcs.testing.ports import free_port  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):  # noqa: SIM115
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---- the fleet (child processes) ---------------------------------------------------------


def fleet_main(
    conn: Connection,
    address: str,
    count: int,
    first: int,
    change_interval_s: float,
    syncer: bool = True,
) -> None:
    asyncio.run(_fleet(conn, address, count, first, change_interval_s, syncer))


async def _fleet(
    conn: Connection,
    address: str,
    count: int,
    first: int,
    change_interval_s: float,
    syncer: bool = True,
) -> None:
    from gcs.raylet.fleet import FleetConfig, RayletFleet
    from gcs.server.logging import configure_logging

    configure_logging("auto", "warning", cache=False)
    fleet = RayletFleet(
        FleetConfig(
            address,
            count=count,
            resources={"CPU": 4.0},
            node_type="cpu4",
            first_index=first,
            name_prefix=f"bench{first}",
            syncer=syncer,
            # a loaded machine registers thousands of agents slowly (seen at load 40)
            register_timeout_s=300.0,
        )
    )
    await fleet.start()
    loop = asyncio.get_running_loop()
    requests: asyncio.Queue[str] = asyncio.Queue()
    loop.add_reader(conn.fileno(), lambda: requests.put_nowait(conn.recv()))
    churn = loop.create_task(_churn(fleet, change_interval_s)) if change_interval_s > 0 else None
    try:
        while True:
            request = await requests.get()
            if request == "stop":
                break
            conn.send(_stats(fleet))
    finally:
        if churn is not None:
            churn.cancel()
        loop.remove_reader(conn.fileno())
        await fleet.stop()
        conn.send({"stopped": True})


async def _churn(fleet: object, interval_s: float) -> None:
    """Each raylet takes or gives back a 1-CPU lease about every ``interval_s`` seconds."""
    agents = list(fleet.agents)  # type: ignore[attr-defined]
    held: dict[int, bytes] = {}
    tick_s = 0.1
    rng = random.Random(len(agents))
    while True:
        await asyncio.sleep(tick_s)
        for _ in range(_draw(rng, len(agents) * tick_s / interval_s)):
            i = rng.randrange(len(agents))
            servicer = agents[i].servicer
            if servicer is None:
                continue
            lease = held.pop(i, None)
            if lease is not None:
                servicer.free(lease)
            else:
                new = servicer.hold({"CPU": 1.0})
                if new is not None:
                    held[i] = new


def _draw(rng: random.Random, mean: float) -> int:
    whole = int(mean)
    return whole + (1 if rng.random() < mean - whole else 0)


def _stats(fleet: object) -> dict[str, float]:
    now = time.monotonic()
    agents = fleet.agents  # type: ignore[attr-defined]
    polls = received = sent = connected = checks = 0
    oldest = 0.0
    for agent in agents:
        servicer, link = agent.servicer, agent.syncer
        checks += agent.health_checks
        if servicer is not None:
            polls += servicer.polls
            if servicer.last_polled_s is not None:
                oldest = max(oldest, now - servicer.last_polled_s)
        if link is not None:
            received += link.stats.received
            sent += link.stats.sent
            connected += link.connected.is_set()
    return {
        "agents": len(agents),
        "polls": polls,
        "health_checks": checks,
        "received": received,
        "sent": sent,
        "connected": connected,
        "oldest_poll_s": oldest,
    }


@dataclass
class Fleet:
    procs: list[mp.process.BaseProcess]
    conns: list[Connection]

    def stats(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for conn in self.conns:
            conn.send("stats")
        for conn in self.conns:
            got = conn.recv()
            for key, value in got.items():
                total[key] = (
                    max(total.get(key, 0.0), value)
                    if key == "oldest_poll_s"
                    else (total.get(key, 0.0) + value)
                )
        return total

    def stop(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send("stop")
        for proc in self.procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def start_fleet(
    address: str, nodes: int, processes: int, change_interval_s: float, syncer: bool = True
) -> Fleet:
    ctx = mp.get_context("spawn")
    procs, conns = [], []
    first = 0
    base, extra = divmod(nodes, processes)
    for i in range(processes):
        count = base + (1 if i < extra else 0)
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=fleet_main,
            args=(child, address, count, first, change_interval_s, syncer),
            daemon=True,
        )
        proc.start()
        procs.append(proc)
        conns.append(parent)
        first += count
    return Fleet(procs, conns)


# ---- the GCSs ------------------------------------------------------------------------------


@dataclass
class Gcs:
    server: Server
    port: int
    metrics_port: int | None


def start_ours() -> Gcs:
    """``gcs serve`` as deployed (front server, memory store), its defaults."""
    port, metrics = free_port(), free_port()
    work = tempfile.TemporaryDirectory(prefix="gcs-bench-ours-")
    cmd = [
        sys.executable, "-m", "gcs.cli.main", "serve", "--host=127.0.0.1", f"--port={port}",
        "--storage=memory://", f"--metrics-port={metrics}", "--log-level=warning",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        cmd, cwd=work.name, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return Gcs(Server("ours", proc, f"127.0.0.1:{port}", work), port, metrics)


def start_ray(binary: Path) -> Gcs:
    """Ray's ``gcs_server`` with its defaults (empty system config)."""
    port = free_port()
    return Gcs(start_ray_server(port, binary, config={}), port, None)


def wait_port(port: int, timeout_s: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


def measure(
    gcs: Gcs,
    nodes: int,
    processes: int,
    window_s: float,
    change_interval_s: float,
    syncer: bool = True,
) -> dict[str, float]:
    wait_port(gcs.port)
    fleet = start_fleet(f"127.0.0.1:{gcs.port}", nodes, processes, change_interval_s, syncer)
    try:
        deadline = time.monotonic() + 600
        while True:
            time.sleep(2)
            stats = fleet.stats()
            linked = stats.get("connected", 0) >= nodes or not syncer
            if stats.get("agents", 0) >= nodes and linked:
                break
            if time.monotonic() > deadline or gcs.server.proc.poll() is not None:
                raise TimeoutError(f"{gcs.server.name}: fleet not up: {stats}")
        # the join relays every view to every raylet (nodes² messages): wait until the relay
        # rate is down to what the churn alone causes, then for the first health checks
        expected = nodes * (nodes - 1) / change_interval_s if change_interval_s > 0 else 0.0
        settle_deadline = time.monotonic() + 600
        received = stats["received"]
        while time.monotonic() < settle_deadline:
            time.sleep(3)
            now_received = fleet.stats()["received"]
            rate, received = (now_received - received) / 3, now_received
            if rate <= 1.5 * expected + nodes:
                break
        time.sleep(8)  # Ray's first health checks start 5 s after registration
        before, cpu0, t0 = fleet.stats(), cpu_seconds(gcs.server.pid), time.monotonic()
        oldest: list[float] = []
        while time.monotonic() - t0 < window_s:
            time.sleep(1)
            oldest.append(fleet.stats()["oldest_poll_s"])
        after, cpu1, t1 = fleet.stats(), cpu_seconds(gcs.server.pid), time.monotonic()
        elapsed = t1 - t0
        cores = (cpu1 - cpu0) / elapsed
        result = {
            "cores": cores,
            "us_per_raylet_s": 1e6 * cores / nodes,
            "rss_mb": rss_mb(gcs.server.pid),
            "polls_per_s": (after["polls"] - before["polls"]) / elapsed,
            "checks_per_s": (after["health_checks"] - before["health_checks"]) / elapsed,
            "relayed_per_s": (after["received"] - before["received"]) / elapsed,
            "views_per_s": (after["sent"] - before["sent"]) / elapsed,
            "oldest_poll_max_s": max(oldest),
            "oldest_poll_mean_s": sum(oldest) / len(oldest),
        }
        rpcs = result["polls_per_s"] + result["checks_per_s"]
        result["us_per_rpc"] = 1e6 * cores / max(rpcs, 1.0)
        if gcs.metrics_port is not None:
            result["gcs_oldest_report_s"] = scrape(gcs.metrics_port).get(
                "gcs_load_poll_max_staleness_seconds", -1.0
            )
        return result
    finally:
        fleet.stop()


def report(name: str, nodes: int, r: dict[str, float]) -> None:
    extra = (
        f"; GCS's oldest report {r['gcs_oldest_report_s']:.2f} s"
        if "gcs_oldest_report_s" in r
        else ""
    )
    print(
        f"  {name:4} nodes={nodes}: {r['us_per_raylet_s']:.1f} us CPU per raylet per s "
        f"({r['cores']:.3f} cores), RSS {r['rss_mb']:.0f} MB, GetResourceLoad "
        f"{r['polls_per_s']:.0f}/s + health checks {r['checks_per_s']:.0f}/s "
        f"({r['us_per_rpc']:.0f} us CPU per raylet RPC), views sent {r['views_per_s']:.1f}/s, "
        f"relayed to raylets "
        f"{r['relayed_per_s']:.0f}/s, oldest load report {r['oldest_poll_mean_s']:.2f} s mean "
        f"/ {r['oldest_poll_max_s']:.2f} s max{extra}  [load {load()}]",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[2000])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--change-interval", type=float, default=0.0)
    parser.add_argument("--servers", default="ours,ray")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--ray-gcs-server", type=Path, default=None)
    args = parser.parse_args()
    binary = args.ray_gcs_server or ray_gcs_server_binary()
    servers = args.servers.split(",")
    if "ray" in servers and binary is None:
        raise SystemExit("Ray's gcs_server binary not found (python -m tests.interop.venvs ray)")
    print(
        f"syncer fleet vs Ray: change interval {args.change_interval or 'idle'} s, "
        f"window {args.window:.0f} s, fleet processes {args.processes}, load {load()}",
        flush=True,
    )
    for nodes in args.nodes:
        for round_ in range(args.rounds):
            results: dict[str, dict[str, float]] = {}
            for name in servers:
                gcs = start_ours() if name == "ours" else start_ray(binary)
                try:
                    results[name] = measure(
                        gcs, nodes, args.processes, args.window, args.change_interval
                    )
                finally:
                    gcs.server.stop()
                report(name, nodes, results[name])
            if "ours" in results and "ray" in results:
                ratio = results["ray"]["us_per_raylet_s"] / max(
                    results["ours"]["us_per_raylet_s"], 1e-9
                )
                print(f"  round {round_ + 1}: Ray / ours CPU per raylet = {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    main()
