"""Health checks across a GCS restart (Ray's: nodes loaded from the store are checked
only after ``health_check_initial_delay_ms``, then need ``failure_threshold`` failed checks
in a row).  Raylets are busy reconnecting right after a restart; a live one must not be
marked dead for it, and one that is gone is found dead within a bounded time."""

from __future__ import annotations

import asyncio
import random

from gcs.base.clock import FakeClock
from gcs.config import HealthCheckConfig
from gcs.managers.events import NodeEvents
from gcs.managers.health import HealthChecker
from gcs.managers.nodes import NodeManager
from gcs.proto import gcs_pb2
from gcs.store.memory import MemoryStore
from gcs.testing.fake_raylets import FakeRayletGateway
from tests.server.known_nodes import register_nodes

CONFIG = HealthCheckConfig(initial_delay_ms=5000, period_ms=3000, failure_threshold=5)
SLOW, GONE = b"\x01" * 28, b"\x02" * 28


async def _restarted(
    store: MemoryStore, clock: FakeClock, raylets: FakeRayletGateway
) -> tuple[NodeManager, HealthChecker]:
    events = NodeEvents()
    nodes = NodeManager(store, clock, events=events)
    health = HealthChecker(nodes, raylets, clock, CONFIG, rng=random.Random(7))
    events.subscribe(health)
    await nodes.load()
    return nodes, health


async def _run_until(clock: FakeClock, health: HealthChecker, until_s: float) -> None:
    """Tick every 0.1 s of fake time, letting started checks finish."""
    while clock.monotonic_s() < until_s:
        clock.advance(0.1)
        health.tick()
        for _ in range(5):
            await asyncio.sleep(0)


async def test_loaded_raylets_get_the_initial_delay_and_the_whole_failure_budget() -> None:
    store, clock, raylets = MemoryStore(), FakeClock(), FakeRayletGateway()
    before = NodeManager(store, clock)
    for n, node_id in enumerate((SLOW, GONE)):
        await before.register(
            gcs_pb2.GcsNodeInfo(
                node_id=node_id, node_manager_address="127.0.0.2", node_manager_port=4000 + n
            )
        )
    # the GCS restarts: one raylet is still reconnecting (not serving yet), one is gone
    raylets.not_serving.add(SLOW)
    raylets.unreachable.add(GONE)
    nodes, health = await _restarted(store, clock, raylets)
    start = clock.monotonic_s()

    await _run_until(clock, health, start + CONFIG.initial_delay_ms / 1000 - 0.1)
    assert raylets.calls_to("HealthCheck") == [], "no check within the initial delay"

    # failing checks until just before the budget can be spent: nobody is dead
    budget_s = CONFIG.initial_delay_ms / 1000 + (CONFIG.failure_threshold - 1) * 3.0
    await _run_until(clock, health, start + budget_s - 0.1)
    assert set(nodes.alive) == {SLOW, GONE}

    raylets.not_serving.discard(SLOW)  # reconnected in time
    await _run_until(clock, health, start + budget_s + 3.0 + 3.1)
    assert set(nodes.alive) == {SLOW}
    assert nodes.dead[GONE].death_info.reason_message == (
        "health check failed due to missing too many heartbeats"
    )
    await health.close()


async def test_loaded_nodes_first_checks_are_spread_evenly_and_queued_as_they_come_due() -> None:
    """10 nodes loaded, checked first within one 3 s period after the 5 s initial delay, one
    per 0.3 s slot; none is queued before its time (a restart builds no 10,000-entry heap
    before it serves), and a node dead before its turn is not checked."""
    store, clock, raylets = MemoryStore(), FakeClock(), FakeRayletGateway()
    ids = await register_nodes(store, clock, 10)
    nodes, health = await _restarted(store, clock, raylets)
    start = clock.monotonic_s() + CONFIG.initial_delay_ms / 1000
    assert not health._due, "nothing queued at load"
    assert await nodes.mark_dead(ids[4], 0, "gone before its first check")
    first: dict[bytes, float] = {}
    while clock.monotonic_s() < start + 3.0:
        clock.advance(0.05)
        health.tick()
        for _ in range(5):
            await asyncio.sleep(0)
        for call in raylets.calls_to("HealthCheck"):
            first.setdefault(call.node_id, clock.monotonic_s())
    assert set(first) == set(ids) - {ids[4]}
    slots = sorted(int((t - start) / 0.3 + 1e-9) for t in first.values())
    assert all(0 <= slot < 11 for slot in slots) and len(set(slots)) >= 8, slots
    await health.close()
