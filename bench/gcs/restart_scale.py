"""Restart at scale (issue 12, defect 4): restart-to-first-RPC, RSS and fds with 50,000 nodes.

A private Redis (``gcs.testing.redis_server.RedisServer``) holds N registered, ALIVE nodes whose
raylet addresses are loopback ports nobody listens on (connections are refused).  The GCS
(`gcs serve`, Ray's default health / poll settings) is then started on that store as its own
process, and this process measures:

* restart-to-first-RPC: from spawning the process to its gRPC port accepting, to the first
  OK ``GetClusterId`` (and the CPU seconds the GCS used until then, a figure that a loaded
  machine distorts less than wall time), and to the first OK ``GetAllNodeInfo(limit=10)``;
* while the GCS reaches the (unreachable) raylets for ``--observe`` seconds: its peak RSS,
  peak open file descriptors (``/proc/<pid>/fd``), and the latency of a ``GetClusterId``
  made every 0.5 s (does it keep serving?).

    python -m bench.gcs.restart_scale [--nodes 50000] [--observe 30] [--server-src DIR]

``--server-src DIR`` runs the GCS from another checkout (e.g. the parent commit, with its
generated protos) for a before/after comparison in the same run.
Targets: first RPC <= 5 s, RSS <= 1.5 GB, fds bounded (below the fd limit).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time

import grpc

from gcs.config import GcsConfig
from gcs.proto import gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.server import GcsServer
from gcs.server.logging import configure_logging
from gcs.store import WriteBatch, store_from_url
from gcs.store.base import TABLE_NODE
from gcs.testing.ports import free_port
from gcs.testing.redis_server import RedisServer

_BATCH = 2000


async def populate(url: str, nodes: int, ports: list[int]) -> None:
    """Create the cluster (meta, ids) with a real start, then write N ALIVE node rows."""
    server = GcsServer(GcsConfig(port=0, metrics_port=-1, storage=url))
    await server.start()
    await server.stop()
    store = store_from_url(url, namespace="default")
    await store.open()
    try:
        for start in range(0, nodes, _BATCH):
            batch = WriteBatch()
            for i in range(start, min(nodes, start + _BATCH)):
                node_id = i.to_bytes(4, "big") + os.urandom(24)
                info = gcs_pb2.GcsNodeInfo(
                    node_id=node_id,
                    node_manager_address="127.0.0.1",
                    node_manager_port=ports[i % len(ports)],
                    object_manager_port=ports[i % len(ports)],
                    node_name=f"node-{i}",
                    state=gcs_pb2.GcsNodeInfo.ALIVE,
                    resources_total={"CPU": 8.0, "memory": 32e9},
                    labels={"ray.io/node-group": "workers"},
                    node_type_name="worker",
                    instance_id=f"i-{i:08d}",
                    start_time_ms=1_700_000_000_000,
                )
                batch.put(TABLE_NODE, node_id, info.SerializeToString())
            await store.write(batch)
    finally:
        await store.close()


def refused_ports(count: int) -> list[int]:
    """Loopback ports nobody listens on, below the ephemeral range.

    An ephemeral port would not do: a connect from 127.0.0.1 to it can pick the same port as
    its source and connect to itself (TCP simultaneous open), which looks like a raylet
    that never answers instead of a refused connection.
    """
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    ports: list[int] = []
    for port in range(low - 1, 1024, -7):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError("no free loopback ports below the ephemeral range")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler(threading.Thread):
    """Peak RSS and open fds of a process, sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_rss_mb = 0.0
        self.peak_fds = 0
        self.rss_mb = 0.0
        self.fds = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                with open(f"/proc/{self.pid}/status") as status:
                    for line in status:
                        if line.startswith("VmRSS:"):
                            self.rss_mb = int(line.split()[1]) / 1024
                            self.peak_rss_mb = max(self.peak_rss_mb, self.rss_mb)
                self.fds = len(os.listdir(f"/proc/{self.pid}/fd"))
                self.peak_fds = max(self.peak_fds, self.fds)
            except (FileNotFoundError, ProcessLookupError):
                return
            self._stop_event.wait(0.2)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


async def first_ok(call: object, started: float, limit_s: float) -> float | None:
    while time.perf_counter() - started < limit_s:
        try:
            await call()  # type: ignore[operator]
            return time.perf_counter() - started
        except (grpc.aio.AioRpcError, OSError):
            await asyncio.sleep(0.02)
    return None


def port_open(port: int) -> object:
    async def probe() -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()

    return probe


async def measure(
    port: int, pid: int, started: float, observe_s: float, verbose: bool
) -> dict[str, object]:
    sampler = Sampler(pid)
    sampler.start()
    out: dict[str, object] = {}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        node_info = ServiceStub(channel, svc.NODE_INFO, timeout_s=2.0)
        cluster_id = b""

        async def get_cluster_id() -> None:
            nonlocal cluster_id
            reply = await node_info.GetClusterId(G.GetClusterIdRequest())
            cluster_id = reply.cluster_id

        out["listening_s"] = await first_ok(port_open(port), started, observe_s)
        out["first_rpc_s"] = await first_ok(get_cluster_id, started, observe_s)
        out["cpu_to_first_rpc_s"] = cpu_at_first = cpu_seconds(pid)
        first_at = time.perf_counter()
        md = [("ray_cluster_id", cluster_id.hex())]
        with_id = ServiceStub(channel, svc.NODE_INFO, metadata=md, timeout_s=5.0)

        async def list_nodes() -> None:
            reply = await with_id.GetAllNodeInfo(G.GetAllNodeInfoRequest(limit=10))
            out["listed_total"] = reply.total

        out["first_list_s"] = await first_ok(list_nodes, started, observe_s)
        latencies, failures = [], 0
        next_report = 0.0
        while time.perf_counter() - started < observe_s:
            t0 = time.perf_counter()
            try:
                await node_info.GetClusterId(G.GetClusterIdRequest())
                latencies.append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError:
                failures += 1
            if verbose and t0 - started >= next_report:
                next_report += 5.0
                print(
                    f"  t={t0 - started:5.1f} s  rss {sampler.rss_mb:6.0f} MB  fds {sampler.fds:6d}"
                    f"  GetClusterId {(time.perf_counter() - t0) * 1000:7.1f} ms",
                    flush=True,
                )
            await asyncio.sleep(max(0.0, 0.5 - (time.perf_counter() - t0)))
        if out["first_rpc_s"] is not None:
            out["cores_after"] = (cpu_seconds(pid) - cpu_at_first) / (
                time.perf_counter() - first_at
            )
        try:
            alive = await with_id.GetAllNodeInfo(
                G.GetAllNodeInfoRequest(limit=1, state_filter=gcs_pb2.GcsNodeInfo.ALIVE)
            )
            out["alive_at_end"] = alive.num_filtered
        except grpc.aio.AioRpcError as err:
            out["alive_at_end"] = None
            print(f"  (alive count not read: {err.code().name})")
    sampler.stop()
    out["peak_rss_mb"] = sampler.peak_rss_mb
    out["peak_fds"] = sampler.peak_fds
    if latencies:
        out["rpc_p50_ms"] = statistics.median(latencies) * 1000
        out["rpc_max_ms"] = max(latencies) * 1000
    out["rpc_failures"] = failures
    return out


def run_once(url: str, observe_s: float, server_src: str | None) -> dict[str, object]:
    port = free_port()
    env = dict(os.environ)
    if server_src:
        env["PYTHONPATH"] = server_src
    started = time.perf_counter()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gcs.cli.main", "serve", "--port", str(port)),
            *("--storage", url, "--metrics-port", "-1"),
            *("--log-level", "error", "--log-format", "json"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=server_src or None,
        start_new_session=True,
    )
    try:
        return asyncio.run(measure(port, proc.pid, started, observe_s, verbose=True))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--observe", type=float, default=30.0, help="seconds after spawn")
    parser.add_argument("--server-src", default=None, help="run the GCS from this checkout")
    args = parser.parse_args()
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    with os.popen("uptime") as up:
        load = up.read().strip()
    configure_logging("console", "error")
    print(f"restart_scale: {args.nodes} nodes, fd limit {soft}; {load}", flush=True)
    ports = refused_ports(64)
    redis = RedisServer(appendfsync="everysec").start()
    try:
        t0 = time.perf_counter()
        asyncio.run(populate(redis.url, args.nodes, ports))
        print(f"populated in {time.perf_counter() - t0:.1f} s", flush=True)
        label = args.server_src or "this checkout"
        result = run_once(redis.url, args.observe, args.server_src)
    finally:
        redis.cleanup()

    def fmt(key: str, unit: str = "", spec: str = ".2f") -> str:
        value = result.get(key)
        return "n/a" if value is None else f"{value:{spec}}{unit}"

    print(f"server: {label}")
    print(f"  restart -> gRPC port accepts      {fmt('listening_s', ' s')}")
    print(f"  restart -> first GetClusterId     {fmt('first_rpc_s', ' s')}   (target <= 5 s)")
    print(f"  GCS CPU until then                {fmt('cpu_to_first_rpc_s', ' s')}")
    print(f"  restart -> first GetAllNodeInfo   {fmt('first_list_s', ' s')}")
    print(f"  peak RSS in {args.observe:.0f} s              {fmt('peak_rss_mb', ' MB', '.0f')}")
    print(f"  peak open fds                     {fmt('peak_fds', '', 'd')} (limit {soft})")
    print(f"  GCS cores used after first RPC    {fmt('cores_after')}")
    print(
        f"  GetClusterId every 0.5 s: p50 {fmt('rpc_p50_ms', ' ms', '.1f')}, "
        f"max {fmt('rpc_max_ms', ' ms', '.1f')}, failed {fmt('rpc_failures', '', 'd')}"
    )
    listed, alive = fmt("listed_total", "", "d"), fmt("alive_at_end", "", "d")
    print(f"  nodes listed {listed}, alive at end {alive}")


if __name__ == "__main__":
    main()
