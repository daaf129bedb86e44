"""A load-poll round never holds the event loop: polls start, and replies are applied, at most
``slice_size`` per loop turn (issue 12 item 7: GetClusterResourceState p99 under polling).

The raylets are fakes answering in-process, so the whole round is loop turns; an observer
task that yields every turn measures how much of the round ran between two of its turns.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import pytest

from gcs.base.clock import FakeClock
from gcs.config import ConfigError, LoadPollConfig, load_config
from gcs.managers.events import NodeEvents
from gcs.managers.load_poller import LoadPoller, SlicedApplier
from gcs.managers.nodes import NodeManager
from gcs.managers.resources import ResourceCache
from gcs.proto import gcs_pb2
from gcs.store.memory import MemoryStore

NODES = 300
SLICE = 16


def _reply() -> gcs_pb2.ResourcesData:
    return gcs_pb2.ResourcesData(resources_available={"CPU": 1.0}, resources_total={"CPU": 4.0})


class _Raylets:
    """Stands in for the raylet gateway: every raylet answers ``GetResourceLoad`` once
    ``answer`` is set (all in the same loop turn: the burst a real round produces)."""

    def __init__(self) -> None:
        self.started = 0
        self.answer = asyncio.Event()

    async def get_resource_load(
        self, node_id: bytes, address: str, timeout_s: float
    ) -> gcs_pb2.ResourcesData:
        self.started += 1
        await self.answer.wait()
        return _reply()


async def _setup(
    on_report: Callable[[bytes], None] | None = None,
) -> tuple[ResourceCache, LoadPoller, _Raylets, NodeManager]:
    clock = FakeClock()
    cache = ResourceCache(clock)
    nodes = NodeManager(MemoryStore(), clock, events=NodeEvents(cache))
    for i in range(NODES):
        await nodes.register(
            gcs_pb2.GcsNodeInfo(
                node_id=i.to_bytes(28, "big"),
                node_manager_address="127.0.0.1",
                node_manager_port=10_000 + i,
                resources_total={"CPU": 4.0},
                state=gcs_pb2.GcsNodeInfo.ALIVE,
            )
        )
    raylets = _Raylets()
    config = LoadPollConfig(slice_size=SLICE, spread=0.0, max_concurrent=10_000, transport="h2")
    poller = LoadPoller(nodes, cache, raylets, clock, config, on_report=on_report)  # type: ignore[arg-type]
    return cache, poller, raylets, nodes


async def _per_turn(
    round_: asyncio.Task[None], cache: ResourceCache, raylets: _Raylets
) -> tuple[int, int]:
    """Largest number of polls started and of replies applied within one loop turn."""
    most_started = most_applied = 0
    started, applied = raylets.started, cache.updates
    while not round_.done():
        if raylets.started == NODES:
            raylets.answer.set()
        await asyncio.sleep(0)
        most_started = max(most_started, raylets.started - started)
        most_applied = max(most_applied, cache.updates - applied)
        started, applied = raylets.started, cache.updates
    await round_
    return most_started, most_applied


async def test_a_round_starts_polls_a_slice_per_loop_turn() -> None:
    cache, poller, raylets, _ = await _setup()
    round_ = asyncio.get_running_loop().create_task(poller.poll_once())
    most_started, _ = await _per_turn(round_, cache, raylets)
    assert raylets.started == NODES
    assert most_started <= SLICE, f"{most_started} polls started in one loop turn"


async def test_a_burst_of_replies_is_applied_a_slice_per_loop_turn() -> None:
    """All replies arrive in one turn; applying them must still take many turns."""
    cache, poller, raylets, _ = await _setup()
    round_ = asyncio.get_running_loop().create_task(poller.poll_once())
    _, most_applied = await _per_turn(round_, cache, raylets)
    assert cache.updates == NODES
    assert most_applied <= SLICE, f"{most_applied} replies applied in one loop turn"


async def test_poll_once_returns_once_every_reply_is_applied() -> None:
    reported: list[bytes] = []
    cache, poller, raylets, _ = await _setup(on_report=reported.append)
    raylets.answer.set()
    await poller.poll_once()
    assert cache.updates == NODES
    assert len(reported) == NODES
    assert poller.stats.polls_ok == NODES
    assert all(e.data.resources_available["CPU"] == 1.0 for e in cache.nodes.values())


async def test_cancelling_a_round_mid_launch_cancels_the_polls_it_started() -> None:
    cache, poller, raylets, _ = await _setup()
    round_ = asyncio.get_running_loop().create_task(poller.poll_once())
    for _ in range(3):
        await asyncio.sleep(0)
    assert 0 < raylets.started < NODES
    round_.cancel()
    with pytest.raises(asyncio.CancelledError):
        await round_
    raylets.answer.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert cache.updates == 0
    assert poller._in_flight == set()


async def test_a_node_that_dies_during_the_launch_is_not_polled() -> None:
    cache, poller, raylets, nodes = await _setup()
    round_ = asyncio.get_running_loop().create_task(poller.poll_once())
    await asyncio.sleep(0)
    last = (NODES - 1).to_bytes(28, "big")
    await nodes.mark_dead(last, 2, "gone")
    raylets.answer.set()
    await round_
    assert raylets.started == NODES - 1
    assert last not in cache.nodes


def test_slice_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="slice_size"):
        SlicedApplier(ResourceCache(FakeClock()), 0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GCS_LOAD_POLL_SLICE_SIZE": "0"}, "load_poll.slice_size: must be >= 1"),
        ({"GCS_LOAD_POLL_SPREAD": "1.5"}, "load_poll.spread: must be in [0, 1]"),
        (
            {"GCS_LOAD_POLL_SPREAD": "half"},
            "load_poll.spread (GCS_LOAD_POLL_SPREAD): expected a number",
        ),
    ],
)
def test_bad_slicing_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(env=env)


def test_slicing_settings_from_the_environment() -> None:
    config = load_config(env={"GCS_LOAD_POLL_SLICE_SIZE": "8", "GCS_LOAD_POLL_SPREAD": "0.25"})
    assert (config.load_poll.slice_size, config.load_poll.spread) == (8, 0.25)
