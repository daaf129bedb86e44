"""The GCS port under attack: ``gcs serve`` and Ray 2.60's own ``gcs_server``, same harness,
same run (issue 18).

    python -m bench.port.run [--servers ours,ray] [--attacks all] [--duration 8]
                             [--attackers 2] [--connections 2] [--kv-keys 10000]
                             [--probe-interval 0.1]

For each attack and each server, a fresh server process (memory store for ours; Ray's
in-memory store), then:

* a probe process: a normal grpc.aio client calling ``InternalKVGet`` every
  ``--probe-interval`` s (5 s deadline), from before the attack until after it;
* ``--attackers`` processes of ``--connections`` connections each run the attack for
  ``--duration`` s, reconnecting whenever the server drops them (``bench/port/attacks.py``);
* the server's RSS sampled every 50 ms.

Per row: the probe's calls, failed calls, p99 and max latency (a failed call counted as
its whole 5 s deadline), the server's RSS growth
(peak during the attack and 1 s after, minus the RSS before it), and what the attackers saw
(GOAWAY codes, connections the server closed).  Targets for ours, every row: 0 failed,
p99 < 500 ms, max < 2 s, RSS growth < 256 MiB, and better than Ray's.

Attacks: ``rapid_reset`` (HEADERS + DATA + RST_STREAM), ``large_bodies`` (160 MiB declared
to GetAllNodeInfo, sent as fast as flow control allows, never finished), ``continuation``
(zero-length CONTINUATION frames), ``ping`` / ``settings`` / ``empty_data`` floods,
``unread_replies`` (8 connections x 16 streams asking for a 7 MiB value, never reading),
``large_reply`` (a normal client reading a 100 MiB value back, twice; its failures are
shown), ``kv_keys`` (InternalKVKeys over ``--kv-keys`` keys of 64 KiB, three times).

The machine is shared: the load average is printed with every row; compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import multiprocessing as mp
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.port import attacks as atk  # noqa: E402

_spec = importlib.util.spec_from_file_location("vs_ray", REPO / "bench/pubsub/vs_ray.py")
assert _spec is not None and _spec.loader is not None
vs_ray = importlib.util.module_from_spec(_spec)
sys.modules["vs_ray"] = vs_ray
_spec.loader.exec_module(vs_ray)

MiB = 1 << 20
PROBE_TIMEOUT_S = 5.0
BIG = [
    ("grpc.max_send_message_length", 512 * MiB),
    ("grpc.max_receive_message_length", 512 * MiB),
]
RAW_ATTACKS: dict[str, Callable[[str, int, float], Awaitable[atk.AttackStats]]] = {
    "rapid_reset": atk.rapid_reset,
    "large_bodies": atk.large_bodies,
    "continuation": atk.continuation_flood,
    "ping": atk.ping_flood,
    "settings": atk.settings_flood,
    "empty_data": atk.empty_data_flood,
    "unread_replies": functools.partial(atk.unread_replies, streams=16),
}
ATTACKS = (
    "rapid_reset",
    "large_bodies",
    "continuation",
    "ping",
    "settings",
    "empty_data",
    "unread_replies",
    "large_reply",
    "kv_keys",
)


# ---- processes -----------------------------------------------------------------------------


def probe_main(conn: Connection, address: str, interval_s: float) -> None:
    async def run() -> atk.ProbeResult:
        async with atk.Probe(address, interval_s=interval_s, timeout_s=PROBE_TIMEOUT_S) as probe:
            conn.send("ready")
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # "stop"
        return probe.result

    result = asyncio.run(run())
    conn.send((result.latencies_s, result.failures))


def attacker_main(conn: Connection, name: str, address: str, duration_s: float, n: int) -> None:
    host, port_text = address.rsplit(":", 1)
    port = int(port_text)

    async def run() -> atk.AttackStats:
        until = time.monotonic() + duration_s
        if name == "large_reply":
            return await _read_back(address, until)
        if name == "kv_keys":
            return await _kv_keys(address, until)
        attack = RAW_ATTACKS[name]
        return await atk.many(n, lambda: attack(host, port, until))

    stats = asyncio.run(run())
    conn.send(stats)


async def _read_back(address: str, until: float) -> atk.AttackStats:
    """A normal client reading the 100 MiB value back (twice at most); a failed read is
    counted as a GOAWAY-less "failure" in ``closed_by_server``."""
    import grpc

    stats = atk.AttackStats()
    body = atk.kv_get_request(b"bench", b"huge")
    async with grpc.aio.insecure_channel(address, options=BIG) as channel:
        call = channel.unary_unary(atk.KV_GET)
        for _ in range(2):
            if time.monotonic() > until:
                break
            try:
                await call(body, timeout=max(5.0, until - time.monotonic() + 30))
                stats.answers += 1
            except grpc.aio.AioRpcError as err:
                stats.closed_by_server += 1
                print(f"  large_reply read failed: {err.code().name}: {err.details()}")
    return stats


async def _kv_keys(address: str, until: float) -> atk.AttackStats:
    import grpc

    stats = atk.AttackStats()
    request = atk._field(2, b"keys")  # InternalKVKeysRequest: prefix = 1, namespace = 2
    async with grpc.aio.insecure_channel(address, options=BIG) as channel:
        call = channel.unary_unary(atk.KV_KEYS)
        for _ in range(3):
            try:
                await call(request, timeout=120)
                stats.answers += 1
            except grpc.aio.AioRpcError as err:
                stats.goaways[err.code().value[0]] = stats.goaways.get(err.code().value[0], 0) + 1
    return stats


# ---- setup ---------------------------------------------------------------------------------


async def _setup(name: str, address: str, kv_keys: int) -> None:
    import grpc

    def put_request(namespace: bytes, key: bytes, value: bytes) -> bytes:
        # InternalKVPutRequest: key = 1, value = 2, overwrite = 3, namespace = 4
        return atk._field(1, key) + atk._field(2, value) + b"\x18\x01" + atk._field(4, namespace)

    async with grpc.aio.insecure_channel(address, options=BIG) as channel:
        put = channel.unary_unary(atk.KV_PUT)
        if name == "unread_replies":
            await put(put_request(b"bench", b"large", b"v" * (7 * MiB)), timeout=120)
        elif name == "large_reply":
            await put(put_request(b"bench", b"huge", b"h" * (100 * MiB)), timeout=300)
        elif name == "kv_keys":
            sem = asyncio.Semaphore(32)

            async def one(i: int) -> None:
                key = b"%08d" % i + b"k" * (64 * 1024 - 8)
                async with sem:
                    await put(put_request(b"keys", key, b"v"), timeout=120)

            await asyncio.gather(*(one(i) for i in range(kv_keys)))


# ---- one row -------------------------------------------------------------------------------


@dataclass
class Row:
    attack: str
    server: str
    latencies_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss_before_mb: float = 0.0
    rss_peak_mb: float = 0.0
    stats: atk.AttackStats = field(default_factory=atk.AttackStats)
    load: str = ""

    def _with_failures(self) -> atk.ProbeResult:
        """A failed call counts as taking the probe's whole deadline."""
        latencies = self.latencies_s + [PROBE_TIMEOUT_S] * len(self.failures)
        return atk.ProbeResult(latencies, self.failures)

    def pct_ms(self, q: float) -> float:
        return self._with_failures().pct_ms(q)

    def max_ms(self) -> float:
        return self._with_failures().max_ms()

    @property
    def growth_mb(self) -> float:
        return self.rss_peak_mb - self.rss_before_mb

    def meets_targets(self) -> bool:
        return (
            not self.failures
            and self.pct_ms(0.99) < 500
            and self.max_ms() < 2000
            and self.growth_mb < 256
        )


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, vs_ray.proc_rss_mb(self.pid))
            except OSError:
                return
            self.stop.wait(0.05)


def run_row(attack: str, server_name: str, args: argparse.Namespace, ray_binary: Any) -> Row:
    ctx = mp.get_context("spawn")
    server = vs_ray.start(server_name, ray_binary)
    row = Row(attack, server_name)
    try:
        asyncio.run(_setup(attack, server.address, args.kv_keys))
        time.sleep(0.5)
        row.rss_before_mb = vs_ray.proc_rss_mb(server.pid)
        probe_parent, probe_child = ctx.Pipe()
        probe = ctx.Process(
            target=probe_main, args=(probe_child, server.address, args.probe_interval)
        )
        probe.start()
        probe_parent.recv()  # first call answered
        sampler = RssSampler(server.pid)
        sampler.start()
        attackers = []
        n = 1 if attack in ("large_reply", "kv_keys") else args.attackers
        per = 8 // n if attack == "unread_replies" else args.connections
        for _ in range(n):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=attacker_main,
                args=(child, attack, server.address, args.duration, per),
            )
            proc.start()
            attackers.append((proc, parent))
        for proc, parent in attackers:
            if parent.poll(args.duration + 300):
                row.stats.add(parent.recv())
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        time.sleep(1.0)  # work the server still does after the attackers left
        sampler.stop.set()
        sampler.join()
        probe_parent.send("stop")
        row.latencies_s, row.failures = probe_parent.recv()
        probe.join(10)
        row.rss_peak_mb = max(sampler.peak, row.rss_before_mb)
        row.load = vs_ray.load_avg()
    finally:
        server.stop()
    return row


def report(row: Row) -> str:
    goaways = ",".join(f"{code:#x}x{n}" for code, n in sorted(row.stats.goaways.items())) or "-"
    return (
        f"{row.attack:15} {row.server:5} calls={len(row.latencies_s) + len(row.failures):4} "
        f"failed={len(row.failures):3}  p99={row.pct_ms(0.99):7.1f} ms  "
        f"max={row.max_ms():7.1f} ms  rss +{row.growth_mb:7.1f} MiB "
        f"({row.rss_before_mb:.0f}->{row.rss_peak_mb:.0f})  conns={row.stats.connections} "
        f"closed_by_server={row.stats.closed_by_server} goaway={goaways} "
        f"answers={row.stats.answers}  load {row.load}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="ours,ray")
    parser.add_argument("--attacks", default="all")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per attack")
    parser.add_argument("--attackers", type=int, default=2, help="attacking processes")
    parser.add_argument("--connections", type=int, default=2, help="connections per process")
    parser.add_argument("--kv-keys", type=int, default=10_000)
    parser.add_argument("--probe-interval", type=float, default=0.1)
    parser.add_argument("--ray-gcs-server", type=Path, default=None)
    args = parser.parse_args()
    attacks = ATTACKS if args.attacks == "all" else tuple(args.attacks.split(","))
    servers = args.servers.split(",")
    ray_binary = args.ray_gcs_server or vs_ray.ray_gcs_server_binary()
    print(f"load average at start: {vs_ray.load_avg()}  (cpus {os.cpu_count()})", flush=True)
    rows: dict[tuple[str, str], Row] = {}
    for attack in attacks:
        for server in servers:
            row = run_row(attack, server, args, ray_binary)
            rows[(attack, server)] = row
            print(report(row), flush=True)
            for failure in sorted(set(row.failures))[:3]:
                print(f"    probe failure: {failure}")
    if "ours" in servers:
        print()
        for attack in attacks:
            ours = rows[(attack, "ours")]
            ray = rows.get((attack, "ray"))
            better = ""
            if ray is not None:
                better = "better than Ray" if _better(ours, ray) else "NOT better than Ray"
            verdict = "meets targets" if ours.meets_targets() else "MISSES targets"
            print(f"{attack:15} ours: {verdict}; {better}")


def _better(ours: Row, ray: Row) -> bool:
    """At least as good on failures, p99, max and RSS growth (within 10 ms / 16 MiB of
    noise), and strictly better on one of them."""
    checks = [
        len(ours.failures) <= len(ray.failures),
        ours.pct_ms(0.99) <= ray.pct_ms(0.99) + 10,
        ours.max_ms() <= ray.max_ms() + 10,
        ours.growth_mb <= ray.growth_mb + 16,
    ]
    strictly = (
        len(ours.failures) < len(ray.failures)
        or ours.pct_ms(0.99) < ray.pct_ms(0.99)
        or ours.max_ms() < ray.max_ms()
        or ours.growth_mb < ray.growth_mb
    )
    return all(checks) and strictly


if __name__ == "__main__":
    main()
