"""Adaptive load polling: a raylet whose syncer view is unchanged since its last poll, and
whose last poll showed no pending demand, is polled only every ``syncer_max_staleness_ms``;
a changed view, a closed stream, pending demand or a raylet without a stream brings back
polling every round."""

from __future__ import annotations

import asyncio

from gcs.base.clock import FakeClock
from gcs.config import HealthCheckConfig, LoadPollConfig
from gcs.managers.events import NodeEvents
from gcs.managers.load_poller import LoadPoller
from gcs.managers.nodes import NodeManager
from gcs.managers.resources import ResourceCache
from gcs.proto import gcs_pb2
from gcs.store.memory import MemoryStore

SYNCING, PLAIN = b"\x01" * 28, b"\x02" * 28


class _Raylets:
    def __init__(self) -> None:
        self.polled: list[bytes] = []
        self.queued: dict[bytes, int] = {}
        """Node -> infeasible requests queued there (its load)."""

    async def get_resource_load(
        self, node_id: bytes, address: str, timeout_s: float
    ) -> gcs_pb2.ResourcesData:
        self.polled.append(node_id)
        data = gcs_pb2.ResourcesData(resources_total={"CPU": 1.0})
        queued = self.queued.get(node_id, 0)
        if queued:
            data.resource_load_by_shape.resource_demands.add(
                shape={"GPU": 1.0}, num_infeasible_requests_queued=queued
            )
        return data


async def _setup(
    staleness_ms: int,
) -> tuple[FakeClock, LoadPoller, _Raylets, dict[bytes, int], ResourceCache]:
    clock = FakeClock()
    cache = ResourceCache(clock)
    nodes = NodeManager(MemoryStore(), clock, events=NodeEvents(cache))
    for n in (SYNCING, PLAIN):
        await nodes.register(
            gcs_pb2.GcsNodeInfo(
                node_id=n,
                node_manager_address="127.0.0.1",
                node_manager_port=1000 + n[0],
                state=gcs_pb2.GcsNodeInfo.ALIVE,
            )
        )
    views = {SYNCING: 7}  # PLAIN has no syncer stream
    raylets = _Raylets()
    poller = LoadPoller(
        nodes,
        cache,
        raylets,  # type: ignore[arg-type]
        clock,
        LoadPollConfig(period_ms=1000, spread=0, syncer_max_staleness_ms=staleness_ms),
        view_version=views.get,
    )
    return clock, poller, raylets, views, cache


async def _round(poller: LoadPoller, raylets: _Raylets) -> set[bytes]:
    raylets.polled.clear()
    await poller.poll_once()
    return set(raylets.polled)


async def test_unchanged_views_back_off_until_the_staleness_bound() -> None:
    clock, poller, raylets, _, _ = await _setup(5000)
    assert await _round(poller, raylets) == {SYNCING, PLAIN}
    for _ in range(4):
        clock.advance(1.0)
        assert await _round(poller, raylets) == {PLAIN}
    clock.advance(1.0)  # 5 s since the last poll of SYNCING: due again
    assert await _round(poller, raylets) == {SYNCING, PLAIN}
    assert poller.stats.skipped_synced == 4


async def test_a_changed_view_or_a_closed_stream_polls_at_once() -> None:
    clock, poller, raylets, views, _ = await _setup(5000)
    await _round(poller, raylets)
    clock.advance(1.0)
    views[SYNCING] = 8  # the view changed: its load may have too
    assert await _round(poller, raylets) == {SYNCING, PLAIN}
    clock.advance(1.0)
    assert await _round(poller, raylets) == {PLAIN}
    del views[SYNCING]  # stream gone
    clock.advance(1.0)
    assert await _round(poller, raylets) == {SYNCING, PLAIN}


async def test_zero_turns_it_off_every_node_every_round() -> None:
    clock, poller, raylets, _, _ = await _setup(0)
    for _ in range(3):
        assert await _round(poller, raylets) == {SYNCING, PLAIN}
        clock.advance(1.0)


def test_on_by_default_within_the_health_check_period() -> None:
    """On by default, and no longer than a health-check period: a poll reply is the
    heartbeat, so a backed-off node costs no health-check RPCs either."""
    staleness_ms = LoadPollConfig().syncer_max_staleness_ms
    assert 0 < staleness_ms <= HealthCheckConfig().period_ms


async def test_pending_demand_keeps_a_node_polled_every_round() -> None:
    """The syncer carries no load: a queued infeasible task changes no resource, so the view
    stays put while the demand moves.  Such a node is polled every round until its queue is
    empty, and the aggregate the autoscaler reads follows each change at once."""
    clock, poller, raylets, _, cache = await _setup(5000)
    raylets.queued[SYNCING] = 3
    await _round(poller, raylets)
    assert _infeasible(cache) == 3
    for queued in (5, 1, 0):
        raylets.queued[SYNCING] = queued
        clock.advance(1.0)
        assert await _round(poller, raylets) == {SYNCING, PLAIN}
        assert _infeasible(cache) == queued
    clock.advance(1.0)  # queue empty, view unchanged: back off again
    assert await _round(poller, raylets) == {PLAIN}


async def test_new_demand_on_a_quiet_node_is_seen_within_the_bound() -> None:
    """The staleness bound: demand that appears on a backed-off node without a view change
    reaches the cache no later than ``syncer_max_staleness_ms`` after the last poll."""
    clock, poller, raylets, _, cache = await _setup(2000)
    await _round(poller, raylets)
    raylets.queued[SYNCING] = 4  # arrives just after the poll
    clock.advance(1.0)
    await _round(poller, raylets)
    assert _infeasible(cache) == 0  # not yet: the view did not move
    clock.advance(1.0)
    assert await _round(poller, raylets) == {SYNCING, PLAIN}
    assert _infeasible(cache) == 4


async def test_a_reply_landing_after_the_round_start_does_not_cost_a_round() -> None:
    """Replies come back a little after their round began; the next poll is still due
    ``syncer_max_staleness_ms`` after the round, not one round later."""
    clock, poller, raylets, _, _ = await _setup(2000)
    raylets_get = raylets.get_resource_load

    async def slow(node_id: bytes, address: str, timeout_s: float) -> gcs_pb2.ResourcesData:
        clock.advance(0.05)  # the reply takes 50 ms
        return await raylets_get(node_id, address, timeout_s)

    raylets.get_resource_load = slow  # type: ignore[method-assign]
    polls = []
    for _ in range(6):
        polls.append(SYNCING in await _round(poller, raylets))
        clock.advance(1.0 - 0.05 * len(raylets.polled))
    assert polls == [True, False, True, False, True, False]


def _infeasible(cache: ResourceCache) -> int:
    return sum(infeasible for _, (_, infeasible, _) in cache.demand.items())


async def test_a_round_that_skips_a_straggler_finishes_before_it_settles() -> None:
    """Rounds overlap: the second round skips the node still in flight and finishes at once;
    only ``settled`` says the straggler's reply is in the cache (the test helper
    ``poll_rounds`` waited on the round count alone, and read an empty load under load)."""
    _, poller, raylets, _, cache = await _setup(0)
    release, waiting = asyncio.Event(), asyncio.Event()
    answer = raylets.get_resource_load

    async def slow(node_id: bytes, address: str, timeout_s: float) -> gcs_pb2.ResourcesData:
        if node_id == PLAIN:
            waiting.set()
            await release.wait()
        return await answer(node_id, address, timeout_s)

    raylets.get_resource_load = slow  # type: ignore[method-assign]
    raylets.queued[PLAIN] = 2
    first = asyncio.create_task(poller.poll_once())
    await waiting.wait()
    await poller.poll_once()  # PLAIN is in flight: skipped, the round ends
    assert poller.stats.rounds == 1 and poller.stats.skipped_in_flight == 1
    assert not poller.settled
    assert not cache.nodes[PLAIN].demand
    release.set()
    await first
    assert poller.settled
    assert cache.nodes[PLAIN].demand
