"""Adaptive load polling: a raylet whose syncer view is unchanged since its last poll is
polled only every ``syncer_max_staleness_ms``; a changed view, a closed stream or a raylet
without a stream brings back polling every round."""

from __future__ import annotations

from gcs.clock import FakeClock
from gcs.config import LoadPollConfig
from gcs.managers.events import NodeEvents
from gcs.managers.nodes import NodeManager
from gcs.managers.resources import LoadPoller, ResourceCache
from gcs.proto import gcs_pb2
from gcs.store.memory import MemoryStore

SYNCING, PLAIN = b"\x01" * 28, b"\x02" * 28


class _Raylets:
    def __init__(self) -> None:
        self.polled: list[bytes] = []

    async def get_resource_load(
        self, node_id: bytes, address: str, timeout_s: float
    ) -> gcs_pb2.ResourcesData:
        self.polled.append(node_id)
        return gcs_pb2.ResourcesData(resources_total={"CPU": 1.0})


async def _setup(staleness_ms: int) -> tuple[FakeClock, LoadPoller, _Raylets, dict[bytes, int]]:
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
    return clock, poller, raylets, views


async def _round(poller: LoadPoller, raylets: _Raylets) -> set[bytes]:
    raylets.polled.clear()
    await poller.poll_once()
    return set(raylets.polled)


async def test_unchanged_views_back_off_until_the_staleness_bound() -> None:
    clock, poller, raylets, _ = await _setup(5000)
    assert await _round(poller, raylets) == {SYNCING, PLAIN}
    for _ in range(4):
        clock.advance(1.0)
        assert await _round(poller, raylets) == {PLAIN}
    clock.advance(1.0)  # 5 s since the last poll of SYNCING: due again
    assert await _round(poller, raylets) == {SYNCING, PLAIN}
    assert poller.stats.skipped_synced == 4


async def test_a_changed_view_or_a_closed_stream_polls_at_once() -> None:
    clock, poller, raylets, views = await _setup(5000)
    await _round(poller, raylets)
    clock.advance(1.0)
    views[SYNCING] = 8  # the view changed: its load may have too
    assert await _round(poller, raylets) == {SYNCING, PLAIN}
    clock.advance(1.0)
    assert await _round(poller, raylets) == {PLAIN}
    del views[SYNCING]  # stream gone
    clock.advance(1.0)
    assert await _round(poller, raylets) == {SYNCING, PLAIN}


async def test_off_by_default_every_node_every_round() -> None:
    clock, poller, raylets, _ = await _setup(0)
    for _ in range(3):
        assert await _round(poller, raylets) == {SYNCING, PLAIN}
        clock.advance(1.0)
    assert LoadPollConfig().syncer_max_staleness_ms == 0
