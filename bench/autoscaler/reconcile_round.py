"""One reconcile round at scale: 2,000 Ray nodes (all tracked instances) and 10,000 pending
requests in mixed shapes, on the recording fakes (no network).

Prints wall time per round and the longest time the event loop was held (the scheduler
runs in a worker thread; everything else is on the loop).  Target: <= 100 ms of loop time.

Run: python -m bench.autoscaler.reconcile_round [--nodes 2000] [--pending 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time

import structlog

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.instances import (
    Instance,
    InstanceManager,
    MemoryInstanceStorage,
    StatusHistory,
)
from gcs.autoscaler.reconciler import CloudInstanceUpdater, EventLog, RayStopper, Reconciler
from gcs.base.clock import FakeClock
from gcs.policy.autoscaling.model import InstanceStatus, NodeKind
from gcs.proto import autoscaler_pb2
from gcs.testing.cloud import FakeAutoscalerGcs, FakeCloudProvider

TYPES = {"cpu8": {"CPU": 8, "memory": 32e9}, "cpu32": {"CPU": 32, "memory": 128e9},
         "gpu4": {"CPU": 16, "GPU": 4, "memory": 64e9}}  # fmt: skip
SHAPES = [{"CPU": c} for c in (0.5, 1, 2, 4)] + [{"CPU": 1, "GPU": 1}, {"CPU": 4, "memory": 8e9}]


def build(nodes: int, pending: int) -> tuple[Reconciler, FakeAutoscalerGcs]:
    cluster = parse_cluster_config(
        {
            "max_workers": nodes * 2,
            "upscaling_speed": 1,
            "head_node_type": "head",
            "available_node_types": {
                "head": {"resources": {"CPU": 0}, "max_workers": 0},
                **{
                    t: {"resources": r, "max_workers": nodes * 2, "min_workers": 0}
                    for t, r in TYPES.items()
                },
            },
        }
    )
    clock = FakeClock()
    storage = MemoryInstanceStorage()
    gcs = FakeAutoscalerGcs()
    provider = FakeCloudProvider(clock)
    names = list(TYPES)
    for n in range(nodes + 1):
        node_type = "head" if n == 0 else names[n % len(names)]
        kind = NodeKind.HEAD if n == 0 else NodeKind.WORKER
        cid, node_id = f"c-{n}", f"{n:056x}"
        provider.add(cid, node_type, kind)
        storage.rows[f"i-{n}"] = Instance(
            f"i-{n}", InstanceStatus.RAY_RUNNING, node_type, kind, cid, node_id, "l",
            history=(StatusHistory(InstanceStatus.RAY_RUNNING, 0),),
        )  # fmt: skip
        total = dict(TYPES.get(node_type, {}))
        if n == 0:
            total["node:__internal_head__"] = 1
        used = {k: v / 2 for k, v in total.items()} if n % 3 else total
        gcs.state.node_states.add(
            node_id=bytes.fromhex(node_id),
            instance_id=cid,
            ray_node_type_name=node_type,
            total_resources=total,
            available_resources={k: total[k] - used.get(k, 0) for k in total},
            status=autoscaler_pb2.RUNNING,
        )
    per_shape = pending // len(SHAPES)
    for shape in SHAPES:
        gcs.state.pending_resource_requests.add(
            request=autoscaler_pb2.ResourceRequest(resources_bundle=shape), count=per_shape
        )
    events = EventLog(clock)
    updater = CloudInstanceUpdater(provider, clock, events)
    stopper = RayStopper(gcs, events)
    im = InstanceManager(storage, clock, subscribers=[updater, stopper])
    rec = Reconciler(
        instances=im, provider=provider, gcs=gcs, cluster=cluster, clock=clock, events=events,
        updater=updater, stopper=stopper,
    )  # fmt: skip
    return rec, gcs


async def probe(stop: asyncio.Event, lags: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(0.001)
        lags.append(loop.time() - t - 0.001)


async def main(nodes: int, pending: int, rounds: int) -> None:
    walls, held = [], []
    for _ in range(rounds):
        rec, _gcs = build(nodes, pending)  # a fresh cluster each round: the heavy first round
        stop, lags = asyncio.Event(), [0.0]
        task = asyncio.create_task(probe(stop, lags))
        t0 = time.perf_counter()
        result = await rec.reconcile_once()
        walls.append(time.perf_counter() - t0)
        stop.set()
        await task
        held.append(max(lags))
    launches = dict(result.reply.launches) if result.reply else {}
    print(f"reconcile round: {nodes} nodes, {pending} pending requests, {rounds} rounds")
    print(f"  wall  p50 {statistics.median(walls) * 1000:7.1f} ms  max {max(walls) * 1000:7.1f} ms")
    print(f"  loop held (longest stall) p50 {statistics.median(held) * 1000:7.1f} ms  "
          f"max {max(held) * 1000:7.1f} ms   target <= 100 ms")  # fmt: skip
    print(f"  decisions: launch {launches}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    asyncio.run(main(args.nodes, args.pending, args.rounds))
