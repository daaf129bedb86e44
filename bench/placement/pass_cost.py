"""One placement pass at scale: the event-loop time of ``PlacementGroupScheduler.place_once``
(node views from the resource cache, the pure policy, starting the two-phase commits) with
N alive nodes and M pending groups in mixed strategies, raylets faked (no network).

Prints, per size: the CPU time of each pass (process time, so a loaded machine inflates it
less than wall time), groups decided, and the two-phase wall time on the fake gateway.  A
pass decides at most ``max_groups_per_pass`` groups and starts at most ``max_in_flight``
two-phase commits.  The first pass builds every node's view; later ones reuse the views of
nodes whose report did not change.

Run: python -m bench.placement.pass_cost [--nodes 500 2000 10000] [--groups 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import time

import structlog

from gcs.base.clock import FakeClock
from gcs.managers.events import JobEvents, NodeEvents, PlacementGroupEvents
from gcs.managers.nodes import NodeManager
from gcs.managers.pg_scheduler import PlacementGroupScheduler
from gcs.managers.placement_groups import PlacementGroupManager
from gcs.managers.resources import ResourceCache
from gcs.proto import common_pb2, gcs_pb2
from gcs.store.memory import MemoryStore
from gcs.testing.fake_raylets import FakeRayletGateway

TYPES = [{"CPU": 8.0}, {"CPU": 32.0}, {"CPU": 16.0, "GPU": 4.0}]
STRATEGIES = [common_pb2.PACK, common_pb2.SPREAD, common_pb2.STRICT_PACK, common_pb2.STRICT_SPREAD]


async def one_size(n_nodes: int, n_groups: int, seed: int) -> None:
    rng = random.Random(seed)
    store = MemoryStore()
    await store.open()
    clock = FakeClock()
    cache = ResourceCache(clock)
    node_events, job_events, pg_events = NodeEvents(cache), JobEvents(), PlacementGroupEvents()
    nodes = NodeManager(store, clock, events=node_events)
    pgs = PlacementGroupManager(store, clock, events=pg_events)
    scheduler = PlacementGroupScheduler(
        pgs, nodes, cache, FakeRayletGateway(), clock,
    )  # fmt: skip
    node_events.subscribe(scheduler)
    job_events.subscribe(scheduler)
    pg_events.subscribe(scheduler)
    for i in range(n_nodes):
        await nodes.register(
            gcs_pb2.GcsNodeInfo(
                node_id=i.to_bytes(28, "big"),
                node_manager_address="10.0.0.1",
                node_manager_port=1 + i % 60000,
                resources_total=TYPES[i % len(TYPES)],
                labels={"zone": "abc"[i % 3]},
                state=gcs_pb2.GcsNodeInfo.ALIVE,
            )
        )
    for g in range(n_groups):
        shape = rng.choice([{"CPU": 1.0}, {"CPU": 4.0}, {"CPU": 2.0, "GPU": 1.0}])
        await pgs.create(
            common_pb2.PlacementGroupSpec(
                placement_group_id=g.to_bytes(18, "big"),
                strategy=rng.choice(STRATEGIES),
                bundles=[common_pb2.Bundle(unit_resources=shape)] * rng.randint(1, 8),
            )
        )
    passes = []
    commit_s = []
    for _ in range(3):
        t0 = time.process_time()
        results = await scheduler.place_once()
        passes.append((time.process_time() - t0, len(results)))
        t1 = time.perf_counter()
        await scheduler.settle()
        commit_s.append(time.perf_counter() - t1)
    created = sum(1 for pg in pgs.groups.values() if pg.state == pg.CREATED)
    times = ", ".join(f"{s * 1000:.1f} ms CPU ({n} groups)" for s, n in passes)
    print(
        f"nodes={n_nodes:>6} pending={n_groups}: pass {times}; "
        f"two-phase on fakes {max(commit_s) * 1000:.1f} ms max; created {created}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 2000, 10000])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    for n in args.nodes:
        await one_size(n, args.groups, args.seed)


if __name__ == "__main__":
    asyncio.run(main())
