"""Demand to RAY_RUNNING with the local provider: a GCS, the autoscaler runtime and real
``gcs raylet`` processes on this machine.  Each trial asks for capacity no running node has
(``request_resources(num_cpus=4)``, Ray's SDK call) and times: demand -> launch requested ->
raylet registered (RAY_RUNNING); then withdraws it and waits for the idle node to drain.
The reconcile interval bounds the first step (Ray's default 5 s; here 1 s unless
--interval-s).

Run: python -m bench.autoscaler.demand_to_running [--trials 3] [--interval-s 1]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time

import structlog

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.runtime import AutoscalerRuntime
from gcs.config import GcsConfig
from gcs.policy.autoscaling.model import InstanceStatus as S
from gcs.policy.autoscaling.model import NodeKind
from gcs.sdk import request_resources
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore

CLUSTER = {
    "cluster_name": "bench",
    "max_workers": 4,
    "upscaling_speed": 1,
    "provider": {"type": "local"},
    "head_node_type": "head",
    "available_node_types": {
        "head": {"resources": {"CPU": 0}, "max_workers": 0},
        "cpu4": {"resources": {"CPU": 4}, "max_workers": 4, "idle_timeout_s": 2},
    },
}


def _workers(rt: AutoscalerRuntime, status: S) -> int:
    return sum(
        1
        for i in rt.instances.instances.values()
        if i.node_kind is NodeKind.WORKER and i.status is status
    )


async def _until(predicate, timeout_s: float = 300.0) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.02)
    return time.perf_counter()


async def main(trials: int, interval_s: float) -> None:
    server = GcsServer(GcsConfig(port=0, metrics_port=-1), store=MemoryStore())
    await server.start()
    with tempfile.TemporaryDirectory() as state_dir:
        rt = AutoscalerRuntime(
            parse_cluster_config(CLUSTER),
            server.address,
            state_dir=state_dir,
            store=server.store,
            interval_s=interval_s,
        )
        await rt.start()
        rows = []
        try:
            await _until(lambda: len(server.managers.nodes.alive) == 1)  # type: ignore[union-attr]
            for _ in range(trials):
                await _until(lambda: _workers(rt, S.RAY_RUNNING) == 0)
                t0 = time.perf_counter()
                await asyncio.to_thread(request_resources, num_cpus=4, address=server.address)
                requested = await _until(
                    lambda: _workers(rt, S.REQUESTED) + _workers(rt, S.ALLOCATED) > 0
                )
                running = await _until(lambda: _workers(rt, S.RAY_RUNNING) > 0)
                rows.append((requested - t0, running - t0))
                await asyncio.to_thread(request_resources, num_cpus=0, address=server.address)
                print(
                    f"  trial: launch requested {requested - t0:5.2f} s, "
                    f"RAY_RUNNING {running - t0:5.2f} s"
                )
        finally:
            await rt.shutdown_cluster()
            await rt.stop()
            await server.stop()
    p50 = [statistics.median(col) for col in zip(*rows, strict=True)]
    print(
        f"demand -> launch requested p50 {p50[0]:.2f} s, -> RAY_RUNNING p50 {p50[1]:.2f} s "
        f"({trials} trials, reconcile every {interval_s:g} s)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--interval-s", type=float, default=1.0)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    asyncio.run(main(args.trials, args.interval_s))
