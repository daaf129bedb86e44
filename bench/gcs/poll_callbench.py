"""Client CPU per GetResourceLoad call: grpc.aio vs the lean HTTP/2 client (h2_unary), and
the HTTP/2 client behind the raylet gateway the load poller calls (slots, rate, pool).

A raylet fleet (``gcs raylet-fleet``) of N agents runs in another process, registered with a
fake GCS; this process then polls every agent R rounds with each transport and reports its own
CPU time per call (reply parsed to ``GetResourceLoadReply`` in both cases).

    python -m bench.gcs.poll_callbench [--agents 200] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import grpc

from gcs.config import RayletIoConfig
from gcs.proto import node_manager_pb2
from gcs.raylet.testing import FakeGcs
from gcs.rpc.raylet_io.budget import budget_for, nofile_soft_limit
from gcs.rpc.raylet_io.grpc_gateway import GrpcRayletGateway
from gcs.rpc.raylet_io.h2_unary import H2UnaryClient
from gcs.rpc.raylet_io.pool import GET_RESOURCE_LOAD_PATH

Reply = node_manager_pb2.GetResourceLoadReply
RAYLET_IO = RayletIoConfig()


async def measure(
    name: str, calls: list[Callable[[], Awaitable[object]]], rounds: int
) -> tuple[float, float]:
    for _ in range(2):
        await asyncio.gather(*(c() for c in calls))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        for raw in await asyncio.gather(*(c() for c in calls)):
            if isinstance(raw, bytes):  # the gateway hands back parsed ResourcesData
                Reply.FromString(raw)
    cpu = time.process_time() - cpu0
    per_call = cpu / (rounds * len(calls)) * 1e6
    wall = time.perf_counter() - wall0
    print(f"{name:8s} {per_call:6.0f} us CPU per call  wall {wall:.2f} s", flush=True)
    return per_call, wall


async def main(agents: int, rounds: int) -> None:
    fake = FakeGcs()
    await fake.start()
    fleet = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "gcs.cli.main", "raylet-fleet", "--gcs-address", fake.address),
        *("--count", str(agents), "--processes", "1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while len(fake.servicer.nodes) < agents:  # noqa: ASYNC110 (FakeGcs has no event)
            await asyncio.sleep(0.2)
        addresses = [
            f"{n.node_manager_address}:{n.node_manager_port}" for n in fake.servicer.nodes.values()
        ]
        request = node_manager_pb2.GetResourceLoadRequest().SerializeToString()
        for _ in range(2):  # alternate to even out noise from the other processes
            channels = [grpc.aio.insecure_channel(a) for a in addresses]
            stubs = [
                c.unary_unary(GET_RESOURCE_LOAD_PATH, _registered_method=True) for c in channels
            ]
            await measure("grpc", [lambda s=s: s(request, timeout=5) for s in stubs], rounds)
            for c in channels:
                await c.close()
            clients = [H2UnaryClient(a, GET_RESOURCE_LOAD_PATH) for a in addresses]
            await measure("h2", [lambda c=c: c.call(request, 5.0) for c in clients], rounds)
            for client in clients:
                client.close()
            gateway = GrpcRayletGateway(budget_for(RAYLET_IO, nofile_soft_limit()))
            ids = [bytes([i % 256, i // 256]) * 14 for i in range(len(addresses))]
            await measure(
                "gateway",
                [
                    lambda n=n, a=a, g=gateway: g.get_resource_load(n, a, 5.0)
                    for n, a in zip(ids, addresses, strict=True)
                ],
                rounds,
            )
            await gateway.close()
    finally:
        fleet.terminate()
        await fleet.wait()
        await fake.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.agents, args.rounds))
