"""Driving an autoscaler against a real GCS by events, not by wall time.

- :class:`NodeWatch`: the GCS's node table as its pubsub publishes it; a raylet that
  registers or dies is an event a test awaits.
- :class:`Rounds`: the autoscaler runtime on a :class:`SteppedClock`; a round happens when
  the test moves time, and the test waits for it to complete.  :meth:`Rounds.until` runs
  rounds until a condition holds; after a round that changed nothing, only the world can
  move things on, so it waits for the world's next event (a node change).
- :func:`load_polled`: one load poll of an in-process GCS, run now (what the GCS learns
  from its raylets by polling, a test waits for by polling it itself, round by round).

Every wait is bounded by a count of events or by ``HANG_S`` (a hang guard, never a pace).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable

import grpc

from gcs.autoscaler.runtime import AutoscalerRuntime
from gcs.proto import gcs_pb2, pubsub_pb2
from gcs.sdk._subscriber import GcsSubscriber
from gcs.server import GcsServer
from tests.autoscaler.clock import SteppedClock

HANG_S = 180.0
"""Bounds a wait for something that must happen; generous for a loaded 2-core machine."""

Predicate = Callable[[], object]


async def holds(predicate: Predicate) -> bool:
    result = predicate()
    if inspect.isawaitable(result):
        result = await result
    return bool(result)


class NodeWatch:
    """Alive and dead nodes as the GCS publishes them (GCS_NODE_INFO_CHANNEL)."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.aio.insecure_channel(address)
        self._sub = GcsSubscriber(self._channel, on_message=self._on_message)
        self.alive: dict[bytes, gcs_pb2.GcsNodeInfo] = {}
        self.dead: dict[bytes, gcs_pb2.GcsNodeInfo] = {}
        self.changes = 0
        self._changed = asyncio.Event()

    async def start(self) -> NodeWatch:
        await self._sub.start()
        await self._sub.subscribe(pubsub_pb2.GCS_NODE_INFO_CHANNEL)
        return self

    async def close(self) -> None:
        await self._sub.close()
        await self._channel.close()

    def _on_message(self, msg: pubsub_pb2.PubMessage) -> None:
        info = msg.node_info_message
        if info.state == gcs_pb2.GcsNodeInfo.ALIVE:
            self.alive[info.node_id] = info
        else:
            self.alive.pop(info.node_id, None)
            self.dead[info.node_id] = info
        self.changes += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def alive_of_type(self, node_type: str) -> list[gcs_pb2.GcsNodeInfo]:
        return [n for n in self.alive.values() if n.node_type_name == node_type]

    async def next_change(self, since: int) -> None:
        """Return once a change after the ``since``-th has been published."""
        while self.changes <= since:
            await asyncio.wait_for(self._changed.wait(), HANG_S)

    async def until(self, predicate: Callable[[NodeWatch], bool]) -> None:
        while not predicate(self):
            await self.next_change(self.changes)


class Rounds:
    """One reconcile round of ``rt`` per call, on its clock."""

    def __init__(self, rt: AutoscalerRuntime, clock: SteppedClock) -> None:
        self.rt = rt
        self.clock = clock

    async def first(self) -> None:
        """Start the runtime; its first round runs at once."""
        done = self.rt.round_completed()
        await self.rt.start()
        await asyncio.wait_for(done.wait(), HANG_S)
        await self.settle()

    async def round(self) -> None:
        done = self.rt.round_completed()
        await self.clock.advance_when_sleeping(self.rt.interval_s)
        await asyncio.wait_for(done.wait(), HANG_S)
        await self.settle()

    async def settle(self) -> None:
        """Let the launches, terminations and drains the round started finish."""
        await asyncio.wait_for(self.rt.updater.settle(), HANG_S)
        await asyncio.wait_for(self.rt.stopper.settle(), HANG_S)

    async def until(
        self, predicate: Predicate, *, nodes: NodeWatch | None = None, max_rounds: int = 60
    ) -> None:
        """Rounds until ``predicate()`` holds.  After a round that changed no instance and
        logged no event only the world can move things on: with ``nodes``, the next node
        registration or death (since the round began) is awaited before the next round."""
        for _ in range(max_rounds):
            if await holds(predicate):
                return
            before = (self.rt.instances.version, self.rt.events.version)
            since = nodes.changes if nodes is not None else 0
            await self.round()
            quiet = before == (self.rt.instances.version, self.rt.events.version)
            if nodes is not None and quiet and not await holds(predicate):
                await nodes.next_change(since)
        assert await holds(predicate), f"not reached within {max_rounds} rounds"


async def load_polled(server: GcsServer, predicate: Predicate, *, polls: int = 100) -> None:
    """Poll the raylets' load now, until ``predicate()`` holds (each poll is one round
    trip to every raylet; the GCS's own poller keeps running meanwhile)."""
    assert server.managers is not None
    for _ in range(polls):
        if await holds(predicate):
            return
        await server.managers.poller.poll_once()
    assert await holds(predicate), f"not reached within {polls} load polls"
