"""DrainNode against a raylet that accepts TCP and never answers (issue 18 item 9).

Three autoscaler DrainNode calls on such a node used to wait for the caller's own deadline
when the node unregistered meanwhile (the pool closed the channel under the calls, grpc.aio
cancelled them, and the handlers never answered); a drain now ends with a definite answer
when the node dies for any reason, and on the raylet timeout otherwise, timed on the GCS's
clock (a ``FakeClock`` here).  The wall-clock bounds below only catch a hang: the old code
answered after the clients' 60 s deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from gcs.base.clock import FakeClock
from gcs.base.errors import RayletUnreachable
from gcs.proto import autoscaler_pb2 as A
from gcs.proto import common_pb2, gcs_pb2, node_manager_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc.raylet_io.pool import RayletClientPool, direct_call
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import Stubs, eventually, fast_config

RAYLET_TIMEOUT_S = 20.0
CLIENT_DEADLINE_S = 60.0
HANG_S = 10.0
"""Bounds a hang only: every answer below is due at once."""
NODE_ID = b"\x07" * 28


class SilentRaylet:
    """Accepts TCP connections and never writes a byte (a hung raylet process)."""

    def __init__(self) -> None:
        self.connections: list[asyncio.StreamWriter] = []
        self.accepted = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self) -> SilentRaylet:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.append(writer)
        self.accepted.set()

    async def stop(self) -> None:
        for writer in self.connections:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class World:
    def __init__(self, server: GcsServer, stubs: Stubs, clock: FakeClock) -> None:
        self.server = server
        self.stubs = stubs
        self.clock = clock

    def drain(self, reason: int = A.DRAIN_NODE_REASON_IDLE_TERMINATION) -> asyncio.Task[object]:
        async def call() -> object:
            try:
                return await self.stubs.autoscaler.DrainNode(
                    A.DrainNodeRequest(node_id=NODE_ID, reason=reason, reason_message="idle"),
                    timeout=CLIENT_DEADLINE_S,
                )
            except grpc.aio.AioRpcError as err:
                return err

        return asyncio.ensure_future(call())

    async def in_flight(self, count: int) -> None:
        """Until ``count`` DrainNode calls wait on the raylet (they cross the gRPC server
        first; nothing else tells when)."""
        manager = self.server.managers.autoscaler  # type: ignore[union-attr]
        await eventually(lambda: manager.drains_waiting(NODE_ID) == count)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    raylet = await SilentRaylet().start()
    clock = FakeClock()
    server = GcsServer(
        fast_config(raylet_rpc_timeout_ms=int(RAYLET_TIMEOUT_S * 1000)),
        store=MemoryStore(),
        clock=clock,
    )
    await server.start()
    try:
        assert server.meta is not None
        async with grpc.aio.insecure_channel(server.address) as channel:
            stubs = Stubs(channel, server.meta.cluster_id)
            info = gcs_pb2.GcsNodeInfo(
                node_id=NODE_ID,
                node_manager_address="127.0.0.1",
                node_manager_port=raylet.port,
                node_manager_hostname="silent",
                state=gcs_pb2.GcsNodeInfo.ALIVE,
            )
            await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=info))
            yield World(server, stubs, clock)
    finally:
        await server.stop()
        await raylet.stop()


@pytest.mark.parametrize(
    "death",
    [
        common_pb2.NodeDeathInfo.UNEXPECTED_TERMINATION,
        common_pb2.NodeDeathInfo.EXPECTED_TERMINATION,
        common_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_IDLE,
    ],
)
async def test_unregister_answers_every_drain_in_flight(world: World, death: int) -> None:
    """The issue's case: three drains in flight, then UnregisterNode (any death reason):
    all three are answered at once, accepted (a node that is gone needs no drain; Ray
    answers a drain of a node that is not alive the same way)."""
    calls = [world.drain() for _ in range(3)]
    await world.in_flight(3)
    await world.stubs.node_info.UnregisterNode(
        G.UnregisterNodeRequest(
            node_id=NODE_ID, node_death_info=common_pb2.NodeDeathInfo(reason=death)
        )
    )
    replies = await asyncio.wait_for(asyncio.gather(*calls), HANG_S)
    assert all(isinstance(r, A.DrainNodeReply) and r.is_accepted for r in replies), replies


async def test_a_drain_of_any_reason_ends_with_the_node(world: World) -> None:
    """A preemption drain (no idle-drain death expected) also ends with the node."""
    call = world.drain(A.DRAIN_NODE_REASON_PREEMPTION)
    await world.in_flight(1)
    await world.stubs.node_info.UnregisterNode(G.UnregisterNodeRequest(node_id=NODE_ID))
    reply = await asyncio.wait_for(call, HANG_S)
    assert isinstance(reply, A.DrainNodeReply) and reply.is_accepted


async def test_silent_raylet_times_out_on_the_gcs_clock(world: World) -> None:
    """Without the unregister every drain fails UNAVAILABLE once the raylet timeout passes
    on the GCS's clock, and not before."""
    calls = [world.drain() for _ in range(3)]
    await world.in_flight(3)
    world.clock.advance(RAYLET_TIMEOUT_S - 1)
    await asyncio.sleep(0)
    assert not any(c.done() for c in calls)
    world.clock.advance(1)
    replies = await asyncio.wait_for(asyncio.gather(*calls), HANG_S)
    for reply in replies:
        assert isinstance(reply, grpc.aio.AioRpcError), reply
        assert reply.code() == grpc.StatusCode.UNAVAILABLE
        assert "no answer within 20 s" in (reply.details() or "")
    node = world.server.managers.autoscaler  # type: ignore[union-attr]
    assert node.drains_waiting(NODE_ID) == 0


async def test_forgotten_node_cuts_its_calls_with_a_domain_error() -> None:
    """The pool letting go of a client (node forgotten) while a call is in flight on its
    channel: the call ends with RayletUnreachable, not a bare CancelledError that looks
    like the caller's own cancellation."""
    raylet = await SilentRaylet().start()
    pool = RayletClientPool(4)
    try:
        call = asyncio.ensure_future(
            direct_call(
                pool,
                NODE_ID,
                f"127.0.0.1:{raylet.port}",
                "DrainRaylet",
                node_manager_pb2.DrainRayletRequest(),
                CLIENT_DEADLINE_S,
            )
        )
        await asyncio.wait_for(raylet.accepted.wait(), HANG_S)
        pool.drop(NODE_ID)
        with pytest.raises(RayletUnreachable, match="connection closed"):
            await asyncio.wait_for(call, HANG_S)
    finally:
        await pool.close()
        await raylet.stop()
