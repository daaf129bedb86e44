"""GetClusterResourceState latency at scale (issue 3 target: p99 <= 50 ms).

2,000 registered nodes, 10,000 distinct pending shapes spread over them (as the load poller
would report them), and between reads a tenth of the nodes report a changed load, so the
measured reads include the incremental re-aggregation a live cluster causes.

    python -m bench.gcs.state_latency [--nodes 2000] [--shapes 10000] [--reads 200]
                                      [--front off,on | off,on,on,off]

Prints p50/p99/max in ms, reply size, and the same figures with the load unchanged.
Compare runs by the printed percentiles (fixed seed).  ``--front off,on`` measures the
grpc.aio port and the front server (which answers every unary call itself, through the
same handler table) one after the other in the same run, plus a small unary call
(GetClusterId), and prints the front/off ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import grpc

from gcs.config import GcsConfig, HealthCheckConfig, LoadPollConfig
from gcs.proto import autoscaler_pb2 as A
from gcs.proto import gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import AUTOSCALER_STATE, NODE_INFO
from gcs.server import GcsServer
from gcs.server.logging import configure_logging
from gcs.store.memory import MemoryStore


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def load_for(
    rng: random.Random, node: int, shapes_per_node: int, salt: int
) -> gcs_pb2.ResourcesData:
    data = gcs_pb2.ResourcesData(
        resources_total={"CPU": 16, "memory": 64e9},
        resources_available={"CPU": float(rng.randint(0, 16)), "memory": 32e9},
        idle_duration_ms=0 if node % 3 else 1000,
    )
    for j in range(shapes_per_node):
        d = data.resource_load_by_shape.resource_demands.add(
            shape={"CPU": 1 + (node * shapes_per_node + j) % 10_000 / 10_000, "GPU": j % 2},
            backlog_size=rng.randint(1, 5) + salt % 2,
        )
        d.label_selectors.add()
    return data


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--shapes", type=int, default=10_000)
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument(
        "--front",
        default="on",
        help="on, off, or a list such as off,on or off,on,on,off (same run; the samples of "
        "each mode are pooled, so an interleaved order cancels drift in the machine's load)",
    )
    args = ap.parse_args()
    configure_logging("console", "warning")
    results: dict[str, dict[str, list[float]]] = {}
    for mode in args.front.split(","):
        print(f"-- front server {mode}  load=[{load_avg()}]")
        pooled = results.setdefault(mode, {})
        for label, samples in (await run_one(args, front=mode == "on")).items():
            pooled.setdefault(label, []).extend(samples)
    if len(results) == 2:
        off, on = results["off"], results["on"]
        for label in off:
            for mode, pooled in (("off", off), ("on", on)):
                ms = pooled[label]
                print(
                    f"pooled {mode} [{label}]: p50={statistics.median(ms):.2f} ms "
                    f"p99={percentile(ms, 0.99):.2f} ms (n={len(ms)})"
                )
            p50 = statistics.median(on[label]) / statistics.median(off[label])
            p99 = percentile(on[label], 0.99) / percentile(off[label], 0.99)
            extra = (statistics.median(on[label]) - statistics.median(off[label])) * 1000
            print(
                f"front/off [{label}]: p50 x{p50:.2f} p99 x{p99:.2f} (p50 {extra:+.0f} µs per call)"
            )


def load_avg() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


async def run_one(args: argparse.Namespace, *, front: bool) -> dict[str, list[float]]:
    rng = random.Random(7)
    config = GcsConfig(
        port=0,
        metrics_port=-1,
        health=HealthCheckConfig(initial_delay_ms=10**9),
        load_poll=LoadPollConfig(period_ms=10**9),
        front_server=front,
    )
    server = GcsServer(config, store=MemoryStore())
    await server.start()
    out: dict[str, list[float]] = {}
    async with grpc.aio.insecure_channel(server.address) as ch:
        cid = (await ServiceStub(ch, NODE_INFO).GetClusterId(G.GetClusterIdRequest())).cluster_id
        md = [("ray_cluster_id", cid.hex())]
        nodes = ServiceStub(ch, NODE_INFO, metadata=md)
        state = ServiceStub(ch, AUTOSCALER_STATE, metadata=md, timeout_s=60)
        ids = [rng.randbytes(28) for _ in range(args.nodes)]
        for i, node_id in enumerate(ids):
            await nodes.RegisterNode(
                G.RegisterNodeRequest(
                    node_info=gcs_pb2.GcsNodeInfo(
                        node_id=node_id,
                        node_manager_address="127.0.0.1",
                        node_manager_port=10000 + i,
                        resources_total={"CPU": 16, "memory": 64e9},
                        node_type_name=f"t{i % 4}",
                        labels={"ray.io/node-id": node_id.hex(), "zone": f"z{i % 3}"},
                        state=gcs_pb2.GcsNodeInfo.ALIVE,
                    )
                )
            )
        assert server.managers is not None
        cache = server.managers.resources
        per_node = max(1, args.shapes // args.nodes)
        for i, node_id in enumerate(ids):
            cache.apply(node_id, load_for(rng, i, per_node, 0))
        reply = await state.GetClusterResourceState(A.GetClusterResourceStateRequest())
        size = reply.ByteSize()
        crs = reply.cluster_resource_state
        print(
            f"nodes={len(crs.node_states)} pending_shapes={len(crs.pending_resource_requests)} "
            f"reply_bytes={size}"
        )

        async def measure(churn: bool) -> list[float]:
            times = []
            for r in range(args.reads):
                if churn:
                    for i in rng.sample(range(args.nodes), args.nodes // 10):
                        cache.apply(ids[i], load_for(rng, i, per_node, r))
                t0 = time.perf_counter()
                await state.GetClusterResourceState(A.GetClusterResourceStateRequest())
                times.append((time.perf_counter() - t0) * 1000)
            return times

        for label, churn in (("steady", False), ("10% of nodes changed load", True)):
            t = out[label] = await measure(churn)
            print(
                f"GetClusterResourceState [{label}]: p50={statistics.median(t):.1f} ms "
                f"p99={percentile(t, 0.99):.1f} ms max={max(t):.1f} ms (n={len(t)}) "
                f"target p99<=50 ms"
            )
        small = []
        cpu0 = time.process_time()
        for _ in range(args.reads * 5):
            t0 = time.perf_counter()
            await nodes.GetClusterId(G.GetClusterIdRequest())
            small.append((time.perf_counter() - t0) * 1000)
        cpu_us = (time.process_time() - cpu0) / len(small) * 1e6
        out["GetClusterId"] = small
        print(
            f"GetClusterId: p50={statistics.median(small) * 1000:.0f} µs "
            f"p99={percentile(small, 0.99) * 1000:.0f} µs (n={len(small)}); "
            f"CPU {cpu_us:.0f} µs per call (client + server, this process)"
        )
    await server.stop()
    return out


if __name__ == "__main__":
    asyncio.run(main())
