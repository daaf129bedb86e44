"""Virtual-cluster figures at scale (issue 5 targets: CreateOrUpdate p50 <= 5 ms; restart to
serving <= 2 s), on a private redis-server (gcs.testing.redis_server).

10,000 nodes (10 node types) are registered through NodeManager with fake addresses
(health checks and load polls pushed out of the run), 1,000 indivisible clusters of 5 nodes
are created over gRPC, then CreateOrUpdate is timed over gRPC (resizing clusters 5 <-> 6), then
the GCS is restarted on the same Redis namespace and start() is timed.

    python -m bench.vcluster.run [--nodes 10000] [--clusters NODES/10] [--updates 300]

(``--clusters`` defaults to a tenth of ``--nodes``, so half the nodes end up in clusters.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import grpc

from gcs.config import GcsConfig, HealthCheckConfig, LoadPollConfig
from gcs.proto import gcs_pb2
from gcs.proto import virtual_cluster_pb2 as V
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import VIRTUAL_CLUSTER_INFO
from gcs.server import GcsServer
from gcs.server.logging import configure_logging
from gcs.store.redis.store import RedisStore
from gcs.testing.redis_server import RedisServer

HOUR_MS = 3_600_000


def config() -> GcsConfig:
    return GcsConfig(
        host="127.0.0.1",
        port=0,
        metrics_port=-1,
        health=HealthCheckConfig(initial_delay_ms=HOUR_MS, period_ms=HOUR_MS),
        load_poll=LoadPollConfig(period_ms=HOUR_MS),
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> None:
    configure_logging("console", "warning")
    redis = RedisServer().start()
    try:
        store = RedisStore(redis.url, namespace="bench")
        await store.open()
        server = GcsServer(config(), store=store)
        await server.start()
        assert server.managers is not None
        nodes = server.managers.nodes
        began = time.perf_counter()
        for i in range(args.nodes):
            await nodes.register(
                gcs_pb2.GcsNodeInfo(
                    node_id=os.urandom(28),
                    node_manager_address="10.0.0.1",
                    node_manager_port=1 + i % 60000,
                    node_manager_hostname=f"host{i}",
                    node_type_name=f"t{i % 10}",
                    resources_total={"CPU": 4},
                    state=gcs_pb2.GcsNodeInfo.ALIVE,
                )
            )
        print(f"registered {args.nodes} nodes in {time.perf_counter() - began:.1f} s")
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = ServiceStub(channel, VIRTUAL_CLUSTER_INFO, timeout_s=30)
            revisions: dict[str, int] = {}
            sizes: dict[str, int] = {}
            began = time.perf_counter()
            for i in range(args.clusters):
                cid = f"vc{i}"
                reply = await stub.CreateOrUpdateVirtualCluster(
                    V.CreateOrUpdateVirtualClusterRequest(
                        virtual_cluster_id=cid, replica_sets={f"t{i % 10}": 5}
                    )
                )
                assert reply.status.code == 0, reply.status.message
                revisions[cid], sizes[cid] = reply.revision, 5
            took = time.perf_counter() - began
            print(f"created {args.clusters} clusters in {took:.1f} s")
            latencies = []
            for i in range(args.updates):
                n = i % args.clusters
                cid = f"vc{n}"
                size = 6 if sizes[cid] == 5 else 5
                started = time.perf_counter()
                reply = await stub.CreateOrUpdateVirtualCluster(
                    V.CreateOrUpdateVirtualClusterRequest(
                        virtual_cluster_id=cid,
                        replica_sets={f"t{n % 10}": size},
                        revision=revisions[cid],
                    )
                )
                latencies.append((time.perf_counter() - started) * 1000)
                assert reply.status.code == 0, reply.status.message
                revisions[cid], sizes[cid] = reply.revision, size
        print(
            f"CreateOrUpdate over gRPC ({args.nodes} nodes, {args.clusters} clusters, Redis): "
            f"p50 {statistics.median(latencies):.2f} ms, p99 {pct(latencies, 0.99):.2f} ms, "
            f"max {max(latencies):.2f} ms"
        )
        await server.stop()
        await store.close()

        store = RedisStore(redis.url, namespace="bench")
        began = time.perf_counter()
        await store.open()
        server = GcsServer(config(), store=store)
        await server.start()
        took = time.perf_counter() - began
        assert server.managers is not None
        registry = server.managers.virtual_clusters.registry
        clusters = len(registry.clusters()) - 1
        violations = registry.invariant_violations()
        print(
            f"restart to serving ({args.nodes} nodes, {clusters} clusters, Redis): "
            f"{took:.2f} s; invariant violations: {len(violations)}"
        )
        await server.stop()
        await store.close()
    finally:
        redis.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--clusters", type=int, default=None)
    parser.add_argument("--updates", type=int, default=300)
    arguments = parser.parse_args()
    if arguments.clusters is None:
        arguments.clusters = arguments.nodes // 10
    asyncio.run(main(arguments))
