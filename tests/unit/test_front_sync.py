"""StartSync on the front server: one flush per loop turn writes a peer's queued entries as
one gRPC message; a raylet that does not read gets nothing more written (its outbox keeps
coalescing to the newest view per node); bad input ends the stream naming the field."""

from __future__ import annotations

import asyncio
from collections import deque

import grpc

from gcs.base.changes import Changes
from gcs.config import RequestLimits
from gcs.front.grpc_framing import OK_TRAILERS, message_frame, trailers_only
from gcs.front.h2 import Stream
from gcs.front.sync import SyncCall, SyncDispatcher
from gcs.managers.sync_hub import GCS_SYNCER_NODE_ID
from gcs.proto import ray_syncer_pb2
from gcs.services.ray_syncer import StartSync
from tests.unit.test_sync_hub import A, B, C, Hub, _node, _view


class FakeConn:
    def __init__(self) -> None:
        self.streams: dict[int, Stream] = {}
        self.headers: list[tuple[int, bytes, bool]] = []
        self.data: list[tuple[int, bytes]] = []
        self.trailers: list[tuple[int, bytes]] = []
        self.corks = 0
        self.parts: list[tuple[int, list[bytes]]] = []
        self.changes = Changes()

    def stream(self, sid: int, node_id: bytes | None) -> Stream:
        headers = [(b":path", b"/ray.rpc.syncer.RaySyncer/StartSync")]
        if node_id is not None:
            headers.append((b"node_id", node_id.hex().encode()))
        stream = self.streams[sid] = Stream(sid, headers, 65535, 65535)
        return stream

    def send_headers(self, stream: Stream, block: bytes, *, end_stream: bool = False) -> None:
        self.headers.append((stream.id, block, end_stream))

    def send_data(self, stream: Stream, data: bytes) -> None:
        self.data.append((stream.id, data))
        self.changes.notify()

    def send_message_parts(self, stream: Stream, parts: list[bytes], size: int) -> None:
        assert sum(map(len, parts)) == size
        self.parts.append((stream.id, parts))
        self.send_data(stream, b"".join(parts))

    def send_trailers(self, stream: Stream, block: bytes) -> None:
        self.trailers.append((stream.id, block))

    def release(self, stream: Stream, size: int) -> None:
        return None

    def cork(self) -> None:
        self.corks += 1

    def uncork(self) -> None:
        return None

    def received(self, sid: int) -> list[tuple[bytes, int]]:
        """(node id, version) of every message written to stream ``sid``."""
        out = []
        for stream_id, data in self.data:
            if stream_id == sid:
                assert data[0] == 0 and int.from_bytes(data[1:5]) == len(data) - 5
                batch = ray_syncer_pb2.RaySyncMessageBatch.FromString(data[5:])
                out.extend((m.node_id, m.version) for m in batch.messages)
        return out


def _batch(*messages: ray_syncer_pb2.RaySyncMessage) -> bytes:
    raw = ray_syncer_pb2.RaySyncMessageBatch(messages=list(messages)).SerializeToString()
    return message_frame(raw)


async def _setup() -> tuple[Hub, SyncDispatcher, FakeConn, SyncCall, SyncCall]:
    h = Hub()
    await h.register(A, B, C)
    dispatcher = SyncDispatcher(StartSync(h.hub, RequestLimits()), 1 << 20)
    conn = FakeConn()
    a = dispatcher.open(conn, conn.stream(1, A), None)  # type: ignore[arg-type]
    b = dispatcher.open(conn, conn.stream(3, B), None)  # type: ignore[arg-type]
    return h, dispatcher, conn, a, b


async def _turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_views_cross_in_one_write_per_loop_turn() -> None:
    h, dispatcher, conn, a, _ = await _setup()
    assert all(GCS_SYNCER_NODE_ID.encode() in block for _, block, _ in conn.headers)
    dispatcher.on_data(conn, a.stream, a, _batch(_view(A, 1)))  # type: ignore[arg-type]
    dispatcher.on_data(conn, a.stream, a, _batch(_view(A, 2), _view(C, 5)))  # type: ignore[arg-type]
    await _turn()
    assert conn.received(3) == [(A, 2), (C, 5)]  # coalesced: A's version 1 never went out
    assert len([sid for sid, _ in conn.data if sid == 3]) == 1
    assert conn.corks == 1  # both peers' frames in one write of their shared connection
    assert conn.received(1) == []  # nothing back to the stream it came from
    assert h.hub.live_version(A) == 2


async def test_a_relayed_view_is_handed_on_as_the_hubs_own_bytes() -> None:
    """The fan-out never copies a view per peer: the connection gets the hub's encoded
    entry object itself (a view carries every bundle's names on its node)."""
    h, dispatcher, conn, a, _ = await _setup()
    dispatcher.on_data(conn, a.stream, a, _batch(_view(A, 1)))  # type: ignore[arg-type]
    await _turn()
    [(sid, parts)] = conn.parts
    entry = h.hub._entries[(A, ray_syncer_pb2.RESOURCE_VIEW)]
    assert sid == 3 and parts[1] is entry and len(parts) == 2


async def test_a_raylet_that_does_not_read_gets_only_the_newest_views() -> None:
    h, dispatcher, conn, a, b = await _setup()
    b.stream.out = deque([memoryview(b"x" * 10)])  # its window is spent: data is queued for it
    for version in range(1, 50):
        dispatcher.on_data(conn, a.stream, a, _batch(_view(A, version)))  # type: ignore[arg-type]
        await _turn()
    assert conn.received(3) == []
    assert len(h.hub.peers[B]) == 1  # bounded: one entry per (node, type)
    b.stream.out = None  # it reads again: the blocked peer's retry writes the newest view
    await conn.changes.until(lambda: conn.received(3) == [(A, 49)])


async def test_a_bad_batch_ends_the_stream_naming_the_field() -> None:
    h, dispatcher, conn, a, _ = await _setup()
    short = ray_syncer_pb2.RaySyncMessage(node_id=b"\x01" * 3, version=1)
    dispatcher.on_data(conn, a.stream, a, _batch(short))  # type: ignore[arg-type]
    [(sid, block)] = conn.trailers
    assert sid == 1 and b"messages[0].node_id has 3 bytes" in block
    assert A not in h.hub.peers


async def test_no_node_id_is_refused_before_any_stream_state() -> None:
    _, dispatcher, conn, _, _ = await _setup()
    call = dispatcher.open(conn, conn.stream(5, None), None)  # type: ignore[arg-type]
    assert call.session is None and call.ended
    message = "metadata node_id is missing (the raylet's hex node id)"
    assert conn.headers[-1] == (5, trailers_only(grpc.StatusCode.INVALID_ARGUMENT, message), True)


async def test_a_reset_or_a_dead_node_disconnects_the_peer() -> None:
    h, dispatcher, conn, _, b = await _setup()
    dispatcher.on_reset(b)
    assert B not in h.hub.peers and h.hub.live_version(B) is None
    h.hub.on_node_dead(_node(A))  # the stream of a dead node ends (OK)
    await _turn()
    assert conn.trailers == [(1, OK_TRAILERS)]
    assert A not in h.hub.peers


async def test_shutdown_ends_every_stream() -> None:
    h, dispatcher, conn, _, _ = await _setup()
    dispatcher.end_all()
    assert sorted(conn.trailers) == [(1, OK_TRAILERS), (3, OK_TRAILERS)]
    assert h.hub.peers == {}
