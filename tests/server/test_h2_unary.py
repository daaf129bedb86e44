"""The lean HTTP/2 unary client against real grpc.aio servers, and the poller using it."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from gcs.base.clock import FakeClock
from gcs.config import ConfigError, LoadPollConfig, load_config
from gcs.proto import autoscaler_pb2 as A
from gcs.proto import gcs_pb2, node_manager_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import NODE_MANAGER
from gcs.rpc.raylet_io.h2_grpc import H2CallError
from gcs.rpc.raylet_io.h2_unary import H2UnaryClient
from gcs.server.app import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import Stubs, fast_config, poll_rounds
from tests.server.fake_raylet import FakeRaylet

PATH = "/ray.rpc.NodeManagerService/GetResourceLoad"
CALL_S = 30.0
"""Deadline of calls that must not time out: generous, a loaded machine can stall a peer in
this very process for seconds; calls that fail do so at once, whatever the deadline."""
Handler = Callable[[bytes, grpc.aio.ServicerContext], Awaitable[bytes]]


def load_reply(raw: bytes) -> node_manager_pb2.GetResourceLoadReply:
    return node_manager_pb2.GetResourceLoadReply.FromString(raw)


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Handler], Awaitable[int]]]:
    """A grpc.aio server whose GetResourceLoad runs a test-supplied raw-bytes handler."""
    servers: list[grpc.aio.Server] = []

    async def make(handler: Handler) -> int:
        server = grpc.aio.server()
        method = grpc.unary_unary_rpc_method_handler(handler)
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "ray.rpc.NodeManagerService", {"GetResourceLoad": method}
                )
            ]
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return port

    yield make
    for server in servers:
        await server.stop(None)


def big_load(shapes: int) -> gcs_pb2.ResourcesData:
    data = gcs_pb2.ResourcesData()
    for i in range(shapes):
        data.resource_load_by_shape.resource_demands.add(
            shape={"CPU": float(i % 7 + 1), f"custom_resource_{i}": 1.0},
            num_ready_requests_queued=i,
            backlog_size=i % 3,
        )
    return data


class TestReplies:
    async def test_decodes_the_raylets_resources(self, raylets) -> None:
        """The reply bytes parse to the same ResourcesData the raylet built."""
        raylet = await raylets({"CPU": 8.0, "GPU": 2.0})
        client = H2UnaryClient(f"127.0.0.1:{raylet.port}", PATH)
        reply = load_reply(await client.call(b"", CALL_S))
        assert reply.resources.node_id == raylet.node_id
        assert dict(reply.resources.resources_total) == {"CPU": 8.0, "GPU": 2.0}
        assert reply.resources.draining_deadline_timestamp_ms == -1
        client.close()

    async def test_many_sequential_and_concurrent_calls_share_one_connection(self, raylets) -> None:
        """Hundreds of calls, in sequence and 200 at once, ride the first connection."""
        raylet = await raylets()
        client = H2UnaryClient(f"127.0.0.1:{raylet.port}", PATH)
        await client.call(b"", CALL_S)
        conn = client._conn
        for _ in range(100):
            assert load_reply(await client.call(b"", CALL_S)).resources.node_id == raylet.node_id
        replies = await asyncio.gather(*(client.call(b"", CALL_S) for _ in range(200)))
        assert all(load_reply(r).resources.node_id == raylet.node_id for r in replies)
        assert client._conn is conn and not conn.closed
        assert raylet.polls == 301
        client.close()

    async def test_large_replies_span_frames_and_windows(self, raylets) -> None:
        """Replies of ~1 MiB (beyond the 64 KiB default windows) arrive whole and concurrently."""
        raylet = await raylets()
        raylet.load = big_load(20000)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{raylet.port}") as channel:
            expected = await ServiceStub(channel, NODE_MANAGER).GetResourceLoad(
                node_manager_pb2.GetResourceLoadRequest(), timeout=5
            )
        assert expected.ByteSize() > 512 * 1024
        client = H2UnaryClient(f"127.0.0.1:{raylet.port}", PATH)
        replies = await asyncio.gather(*(client.call(b"", CALL_S) for _ in range(8)))
        for raw in replies:
            assert load_reply(raw) == expected
        client.close()

    async def test_a_reply_above_the_size_limit_is_refused(self, raylets) -> None:
        """Bounded memory: the stream is reset and the call fails with RESOURCE_EXHAUSTED."""
        raylet = await raylets()
        raylet.load = big_load(2000)
        client = H2UnaryClient(f"127.0.0.1:{raylet.port}", PATH, max_message_bytes=10_000)
        with pytest.raises(H2CallError) as err:
            await client.call(b"", CALL_S)
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        raylet.load = None
        assert load_reply(await client.call(b"", CALL_S)).resources.node_id == raylet.node_id
        client.close()


class TestErrors:
    async def test_server_abort_is_a_typed_error_with_code_and_message(self, raw_server) -> None:
        """An aborted handler's status and percent-encoded message come back decoded."""

        async def handler(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad load: 100% wrong é")

        port = await raw_server(handler)
        client = H2UnaryClient(f"127.0.0.1:{port}", PATH)
        for _ in range(3):
            with pytest.raises(H2CallError) as err:
                await client.call(b"", CALL_S)
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details == "bad load: 100% wrong é"
        client.close()

    async def test_unknown_method_is_unimplemented(self, raylets) -> None:
        """A path the server does not serve fails with UNIMPLEMENTED."""
        raylet = await raylets()
        client = H2UnaryClient(f"127.0.0.1:{raylet.port}", "/ray.rpc.NodeManagerService/Nope")
        with pytest.raises(H2CallError) as err:
            await client.call(b"", CALL_S)
        assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
        client.close()

    async def test_deadline_on_a_server_that_never_answers(self, raw_server) -> None:
        """The call fails with DEADLINE_EXCEEDED on time; the connection stays usable."""
        hang = asyncio.Event()

        async def handler(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            if not hang.is_set():
                hang.set()
                await asyncio.sleep(3600)
            return node_manager_pb2.GetResourceLoadReply().SerializeToString()

        port = await raw_server(handler)
        client = H2UnaryClient(f"127.0.0.1:{port}", PATH)
        started = time.monotonic()
        with pytest.raises(H2CallError) as err:
            await client.call(b"", 0.3)
        assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert 0.25 <= time.monotonic() - started < 10.0  # on time: not early, never hung
        conn = client._conn
        assert await client.call(b"", CALL_S) == b""
        assert client._conn is conn and not conn._streams
        client.close()

    async def test_server_down_then_back_on_the_same_port(self) -> None:
        """Calls fail UNAVAILABLE while the raylet is gone and succeed once it returns."""
        first = FakeRaylet({"CPU": 1.0})
        await first.start()
        port = first.port
        client = H2UnaryClient(f"127.0.0.1:{port}", PATH)
        await client.call(b"", CALL_S)
        await first.stop()
        with pytest.raises(H2CallError) as err:
            await client.call(b"", CALL_S)
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE
        with pytest.raises(H2CallError) as err:
            await client.call(b"", CALL_S)  # connection refused now
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE
        second = FakeRaylet({"CPU": 2.0})
        await second.start(port)
        try:
            reply = load_reply(await client.call(b"", CALL_S))
            assert reply.resources.node_id == second.node_id
        finally:
            client.close()
            await second.stop()


class TestProtocolDetails:
    async def test_pings_settings_and_goaway_from_a_scripted_peer(self) -> None:
        """PING and SETTINGS are acked; GOAWAY fails the in-flight call with UNAVAILABLE."""
        seen: list[tuple[int, int]] = []
        done = asyncio.Event()

        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert await reader.readexactly(24) == b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            writer.write(frame(4, 0, 0, b"") + frame(6, 0, 0, b"12345678"))
            while not {(1, 4), (4, 1), (6, 1)} <= set(seen):
                header = await reader.readexactly(9)
                length = int.from_bytes(header[:3])
                await reader.readexactly(length)
                seen.append((header[3], header[4]))
                if header[3] == 1:  # the call's HEADERS: refuse it by going away
                    writer.write(frame(7, 0, 0, struct.pack(">II", 0, 0) + b"bye"))
            done.set()
            writer.close()

        server = await asyncio.start_server(peer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = H2UnaryClient(f"127.0.0.1:{port}", PATH)
        with pytest.raises(H2CallError) as err:
            await client.call(b"", CALL_S)
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "GOAWAY" in err.value.details
        await asyncio.wait_for(done.wait(), 30)
        assert (4, 1) in seen  # SETTINGS ack
        assert (6, 1) in seen  # PING ack
        client.close()
        server.close()

    async def test_an_oversized_frame_fails_the_connection(self) -> None:
        """A frame above the 16 KiB maximum we advertise is a protocol error, not a buffer."""

        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(24)
            writer.write(frame(4, 0, 0, b"") + (1 << 20).to_bytes(3) + b"\x00\x00" + bytes(4))
            await reader.read()
            writer.close()

        server = await asyncio.start_server(peer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = H2UnaryClient(f"127.0.0.1:{port}", PATH)
        with pytest.raises(H2CallError) as err:
            await client.call(b"", CALL_S)
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "protocol error" in err.value.details
        client.close()
        server.close()


def frame(ftype: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3) + bytes((ftype, flags)) + stream_id.to_bytes(4) + payload


class TestPollerOverH2:
    async def test_gcs_polls_raylet_load_over_h2(self, raylets) -> None:
        """With transport=h2 the GCS sees a raylet's pending demand in its cluster state."""
        config = fast_config(
            load_poll=LoadPollConfig(period_ms=100, timeout_ms=5_000, transport="h2")
        )
        clock = FakeClock()
        server = GcsServer(config, store=MemoryStore(), clock=clock)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                assert server.meta is not None
                stubs = Stubs(channel, server.meta.cluster_id)
                raylet = await raylets({"CPU": 4.0})
                raylet.load = gcs_pb2.ResourcesData(
                    resources_available={"CPU": 1.0},
                    resource_load_by_shape=gcs_pb2.ResourceLoad(
                        resource_demands=[
                            gcs_pb2.ResourceDemand(shape={"CPU": 2.0}, num_ready_requests_queued=3)
                        ]
                    ),
                )
                await stubs.node_info.RegisterNode(
                    G.RegisterNodeRequest(node_info=raylet.node_info())
                )

                async def pending() -> list[A.ResourceRequestByCount]:
                    reply = await stubs.autoscaler.GetClusterResourceState(
                        A.GetClusterResourceStateRequest()
                    )
                    return list(reply.cluster_resource_state.pending_resource_requests)

                await poll_rounds(server, clock)
                (request,) = await pending()
                assert dict(request.request.resources_bundle) == {"CPU": 2.0}
                assert request.count == 3
                reply = await stubs.autoscaler.GetClusterResourceState(
                    A.GetClusterResourceStateRequest()
                )
                (node,) = reply.cluster_resource_state.node_states
                assert dict(node.available_resources) == {"CPU": 1.0}
                assert server.managers is not None
                assert server.managers.poller.stats.polls_failed == 0
        finally:
            await server.stop()


class TestConfig:
    def test_transport_comes_from_the_environment(self) -> None:
        """GCS_LOAD_POLL_TRANSPORT selects the transport; anything but grpc/h2 is refused."""
        assert load_config(env={}).load_poll.transport == "h2"
        assert load_config(env={"GCS_LOAD_POLL_TRANSPORT": "h2"}).load_poll.transport == "h2"
        with pytest.raises(ConfigError, match="transport"):
            load_config(env={"GCS_LOAD_POLL_TRANSPORT": "http3"})


class TestFallback:
    async def test_a_raylet_the_h2_client_cannot_read_is_polled_with_grpc(
        self, gcs_server, gcs_clock, raylets, monkeypatch
    ) -> None:
        """A protocol-level failure (INTERNAL) moves that node to grpc; its polls succeed."""
        from gcs.rpc.raylet_io.pool import RayletClient

        class Broken:
            async def call(self, message: bytes, timeout_s: float, path: object = None) -> bytes:
                raise H2CallError(grpc.StatusCode.INTERNAL, "unsupported peer")

            async def close(self) -> None:
                return None

        monkeypatch.setattr(RayletClient, "h2", lambda self: Broken())
        raylet = await raylets()
        await gcs_server.managers.nodes.register(raylet.node_info())
        await gcs_clock.advance_until(lambda: raylet.polls >= 2, step_s=0.1)
        assert raylet.node_id in gcs_server.managers.raylets.grpc_only
