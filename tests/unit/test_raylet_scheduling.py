"""When and how often managers reach raylets: health checks, load polls, restart spread.

All on the fake clock and the fake gateway (no sockets, no sleeps that time anything).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from gcs.base.clock import FakeClock
from gcs.config import HealthCheckConfig, LoadPollConfig, RayletIoConfig
from gcs.managers.events import NodeEvents
from gcs.managers.health import HealthChecker
from gcs.managers.load_poller import LoadPoller
from gcs.managers.nodes import NodeManager
from gcs.managers.resources import ResourceCache
from gcs.managers.startup_spread import spread, spread_lazily, spread_window_s
from gcs.proto import gcs_pb2
from gcs.rpc.raylet_io.budget import budget_for
from gcs.rpc.raylet_io.rate import RateLimiter
from gcs.store import WriteBatch
from gcs.store.base import TABLE_NODE
from gcs.store.memory import MemoryStore
from gcs.testing.fake_raylets import FakeRayletGateway

HEALTH = HealthCheckConfig(
    initial_delay_ms=5000, period_ms=3000, timeout_ms=10000, failure_threshold=5
)


def node(i: int) -> gcs_pb2.GcsNodeInfo:
    return gcs_pb2.GcsNodeInfo(
        node_id=i.to_bytes(4, "big") * 7,
        node_manager_address="127.0.0.1",
        node_manager_port=20000 + i % 100,
        state=gcs_pb2.GcsNodeInfo.ALIVE,
        resources_total={"CPU": 4.0},
    )


async def restarted_nodes(count: int, clock: FakeClock, listeners: list[object]) -> NodeManager:
    """A NodeManager that loads ``count`` ALIVE nodes from its store, as after a restart."""
    store = MemoryStore()
    batch = WriteBatch()
    for i in range(count):
        batch.put(TABLE_NODE, node(i).node_id, node(i).SerializeToString())
    await store.write(batch)
    nodes = NodeManager(store, clock, events=NodeEvents(*listeners))  # type: ignore[arg-type]
    await nodes.load()
    return nodes


async def settle() -> None:
    """Let started checks and the deaths they cause (on the node manager's lane) finish."""
    for _ in range(30):
        await asyncio.sleep(0)


class TestHealthAfterRestart:
    async def test_first_checks_are_spread_over_a_period(self) -> None:
        """1,000 nodes loaded at once are first checked across one period, not on one tick."""
        clock, gateway = FakeClock(), FakeRayletGateway()
        checker = HealthChecker(None, gateway, clock, HEALTH, rng=random.Random(7))  # type: ignore[arg-type]
        await restarted_nodes(1000, clock, [checker])
        clock.advance(4.99)
        assert checker.tick() == 0
        started_per_tick = []
        for _ in range(31):  # 0.1 s ticks over [5, 8) s
            clock.advance(0.1)
            started_per_tick.append(checker.tick())
            await settle()
        assert len({c.node_id for c in gateway.calls_to("HealthCheck")}) == 1000
        assert max(started_per_tick) < 100  # ~33 expected per 0.1 s tick

    async def test_unreachable_nodes_die_spread_out_after_threshold_checks_made(self) -> None:
        """Every death follows `failure_threshold` failed checks actually made; not all at once."""
        clock, gateway = FakeClock(), FakeRayletGateway()
        checker = HealthChecker(None, gateway, clock, HEALTH, rng=random.Random(3))  # type: ignore[arg-type]
        nodes = await restarted_nodes(300, clock, [checker])
        checker._nodes = nodes  # the NodeManager above needed the checker first
        gateway.unreachable.update(nodes.alive)
        dead_per_tick = []
        for _ in range(300):  # 30 s in 0.1 s ticks
            clock.advance(0.1)
            before = len(nodes.alive)
            checker.tick()
            await settle()
            dead_per_tick.append(before - len(nodes.alive))
        assert not nodes.alive
        assert max(dead_per_tick) < 60
        checks = [c.node_id for c in gateway.calls_to("HealthCheck")]
        assert all(checks.count(node_id) == 5 for node_id in set(checks))

    async def test_checks_waiting_for_a_slot_are_not_failures(self) -> None:
        """With every slot held by hung checks, the others wait; no node is failed meanwhile."""
        clock, gateway = FakeClock(), FakeRayletGateway()
        config = HealthCheckConfig(
            initial_delay_ms=0, period_ms=1000, timeout_ms=1000, failure_threshold=1,
            max_concurrent=10,
        )  # fmt: skip
        checker = HealthChecker(None, gateway, clock, config, rng=random.Random(1))  # type: ignore[arg-type]
        nodes = await restarted_nodes(100, clock, [checker])
        checker._nodes = nodes
        gateway.hold()
        for _ in range(50):
            clock.advance(0.5)
            checker.tick()
            await settle()
        assert gateway.max_in_flight == 10
        assert checker.in_flight == 10
        assert len(nodes.alive) == 100
        gateway.unreachable.update(nodes.alive)
        gateway.release()
        await checker.settle()  # the checks and the deaths they cause
        assert len(nodes.alive) == 90  # exactly the ten checks that were made
        await checker.close()


class TestLoadPoller:
    async def poller(
        self, count: int, gateway: FakeRayletGateway, clock: FakeClock, **config: int
    ) -> tuple[LoadPoller, NodeManager]:
        cache = ResourceCache(clock)
        nodes = await restarted_nodes(count, clock, [cache])
        cfg = LoadPollConfig(period_ms=1000, timeout_ms=500, **config)  # type: ignore[arg-type]
        return LoadPoller(nodes, cache, gateway, clock, cfg), nodes

    async def test_a_round_holds_at_most_max_concurrent_polls(self) -> None:
        """Poll tasks exist only once they have a slot: 500 nodes, 20 slots, 20 in flight."""
        clock, gateway = FakeClock(), FakeRayletGateway()
        poller, _ = await self.poller(500, gateway, clock, max_concurrent=20)
        gateway.hold()
        round_ = asyncio.create_task(poller.poll_once())
        await settle()
        assert gateway.in_flight == 20
        assert len(asyncio.all_tasks()) < 30
        gateway.release()
        # slices of a round are spread over half the period of the clock
        await clock.advance_until(round_.done, step_s=0.1)
        assert gateway.max_in_flight <= 20
        assert poller.stats.polls_ok == 500

    async def test_first_polls_follow_the_spread(self) -> None:
        """Nodes given first-poll times are polled only once the fake clock reaches them."""
        clock, gateway = FakeClock(), FakeRayletGateway()
        poller, nodes = await self.poller(100, gateway, clock, spread=0)  # slices back to back
        due = spread(nodes.alive, clock.monotonic_s(), 10.0, random.Random(5))
        poller.spread_first_polls(due)
        polled = []
        for _ in range(10):
            clock.advance(1.0)
            await poller.poll_once()
            polled.append(len({c.node_id for c in gateway.calls}))
        assert polled == [10 * (i + 1) for i in range(10)]

    async def test_failing_raylet_is_polled_with_backoff(self) -> None:
        """Polled 1, 2, 4 ... periods apart while failing, at most the cap apart; reset on OK."""
        clock, gateway = FakeClock(), FakeRayletGateway()
        poller, nodes = await self.poller(1, gateway, clock, failure_backoff_max_ms=5000)
        (node_id,) = nodes.alive
        gateway.unreachable.add(node_id)
        polled_at = []
        for second in range(25):
            before = len(gateway.calls)
            await poller.poll_once()
            if len(gateway.calls) > before:
                polled_at.append(second)
            clock.advance(1.0)
        assert polled_at == [0, 1, 3, 7, 12, 17, 22]
        gateway.unreachable.clear()
        clock.advance(5.0)
        for _ in range(3):
            await poller.poll_once()
            clock.advance(1.0)
        assert poller.stats.polls_ok == 3


class TestSpread:
    def test_spread_is_even_with_jitter(self) -> None:
        """10,000 ids over 10 s: 1,000 +- 1 per second, all inside the window, order shuffled."""
        ids = [i.to_bytes(4, "big") for i in range(10_000)]
        due = spread(ids, 100.0, 10.0, random.Random(0))
        per_second = [0] * 10
        for t in due.values():
            assert 100.0 <= t < 110.0
            per_second[int(t - 100.0)] += 1
        assert all(abs(n - 1000) <= 1 for n in per_second)
        assert sorted(due, key=due.__getitem__) != ids
        assert list(due.values()) == sorted(due.values()), "in time order: nobody sorts them"

    def test_a_lazy_spread_is_as_even_in_time_order(self) -> None:
        ids = [i.to_bytes(4, "big") for i in range(10_000)]
        due = list(spread_lazily(list(ids), 10.0, random.Random(0)))
        assert sorted(node_id for node_id, _ in due) == ids, "each once"
        assert [node_id for node_id, _ in due] != ids, "shuffled"
        times = [t for _, t in due]
        assert times == sorted(times) and times[0] >= 0.0 and times[-1] < 10.0
        per_second = [0] * 10
        for t in times:
            per_second[int(t)] += 1
        assert all(abs(n - 1000) <= 1 for n in per_second)
        assert [t for _, t in spread_lazily(list(ids[:3]), 0.0, random.Random(0))] == [0.0] * 3

    def test_window_follows_the_contact_rate(self) -> None:
        assert spread_window_s(50_000, 2000) == 25.0
        assert spread_window_s(0, 2000) == 0.0


class TestRateLimiter:
    def test_bursts_then_the_rate(self) -> None:
        clock = FakeClock()
        limiter = RateLimiter(100, 10, clock)
        assert [limiter.reserve() for _ in range(10)] == [0.0] * 10
        assert limiter.reserve() == pytest.approx(0.01)  # one sleep each, in order
        assert limiter.reserve() == pytest.approx(0.02)
        clock.advance(0.05)  # 5 tokens: 2 repay the debt
        waits = [limiter.reserve() for _ in range(4)]
        assert waits[:3] == pytest.approx([0.0] * 3, abs=1e-9)
        assert waits[3] == pytest.approx(0.01)

    async def test_a_wait_for_a_token_sleeps_on_the_clock(self) -> None:
        clock = FakeClock()
        limiter = RateLimiter(10, 1, clock)
        await limiter.acquire()  # the burst
        waiting = asyncio.ensure_future(limiter.acquire())
        await clock.advance_until(lambda: clock.sleepers == 1, step_s=0.0)
        assert clock.next_wake_s == pytest.approx(0.1) and not waiting.done()
        clock.advance(0.1)
        await waiting


class TestBudget:
    def test_budget_from_the_fd_limit(self) -> None:
        """A quarter of the fds (>= 256) stay with the GCS; 2 per raylet client; calls < clients."""
        budget = budget_for(RayletIoConfig(), 1024)
        assert budget.max_open_clients == (1024 - 256) // 2
        assert budget.max_in_flight == budget.max_open_clients * 3 // 4
        big = budget_for(RayletIoConfig(), 1 << 20)
        assert big.max_open_clients == (3 << 18) // 2
        assert big.max_in_flight == 1024

    def test_explicit_settings_win_but_calls_stay_below_clients(self) -> None:
        budget = budget_for(RayletIoConfig(max_open_clients=16, max_in_flight=64), 1024)
        assert (budget.max_open_clients, budget.max_in_flight) == (16, 16)


class TestLagGovernor:
    def test_lag_halves_the_rate_and_calm_restores_it(self) -> None:
        """Lagging loop: rate halves down to the floor; calm loop: +10% up to the ceiling."""
        from gcs.rpc.raylet_io.rate import LagGovernor

        limiter = RateLimiter(1000, 1000, FakeClock())
        governor = LagGovernor(limiter, max_rate=1000, min_rate=100)
        assert [governor.observe(0.2) for _ in range(5)] == [500, 250, 125, 100, 100]
        assert governor.observe(0.05) == 100  # in between: unchanged
        rates = [governor.observe(0.0) for _ in range(30)]
        assert rates[0] == pytest.approx(110)
        assert rates[-1] == 1000
        assert limiter.rate == 1000
