"""Prototype: the pubsub harness served by a lean asyncio HTTP/2 server instead of grpc.aio.

    python bench/pubsub/lean_server.py PORT

A measurement aid, not a server to deploy: it answers only what ``vs_ray.py`` calls
(GetClusterId, RegisterNode, GcsSubscriberCommandBatch, GcsSubscriberPoll), over plaintext
HTTP/2 with no auth and no store.  The pubsub logic is our real
:class:`~gcs.managers.pubsub.publisher.Publisher`; only the transport differs from ``gcs serve``:
one ``asyncio.Protocol`` per connection, frames parsed by hand (``hpack`` for request
headers), a held poll completed by a future callback that writes one pre-encoded
HEADERS + DATA + trailers burst -- no task, no coroutine and no completion-queue hop per
call.  ``vs_ray.py --servers ours,lean,ray`` prices what replacing grpc.aio on the GCS
port (a front server that owns the port, serves the pubsub methods itself and forwards
every other stream to grpc.aio) would buy.
"""

from __future__ import annotations

import asyncio
import signal
import struct
import sys

import hpack

from gcs.base.clock import SystemClock
from gcs.managers.pubsub import GCS_NODE_INFO_CHANNEL, Publisher, PublisherConfig
from gcs.proto import gcs_service_pb2

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEADER = struct.Struct(">IBI")  # length(24) + type(8) packed as one int, flags, stream id
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0,
    1,
    3,
    4,
    6,
    7,
    8,
    9,
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20


def _frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return _HEADER.pack((len(payload) << 8) | ftype, flags, stream_id) + payload


def _literal(index: int, value: bytes) -> bytes:
    assert index < 15 and len(value) < 127
    return bytes((index,)) + bytes((len(value),)) + value


def _literal_new(name: bytes, value: bytes) -> bytes:
    return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value


_RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + bytes((16,)) + b"application/grpc"  # :status 200
_TRAILERS = _literal_new(b"grpc-status", b"0")
_CLUSTER_ID = gcs_service_pb2.GetClusterIdReply(cluster_id=b"c" * 28).SerializeToString()


class App:
    def __init__(self) -> None:
        self.pub = Publisher(PublisherConfig.control_plane(), SystemClock())

    def handle(self, path: str, body: bytes, reply: object) -> None:
        """Dispatch one unary call; ``reply(bytes)`` answers it (now or later)."""
        method = path.rsplit("/", 1)[-1]
        if method == "GcsSubscriberPoll":
            req = gcs_service_pb2.GcsSubscriberPollRequest.FromString(body)
            fut = self.pub.poll(req.subscriber_id, req.max_processed_sequence_id, req.publisher_id)
            if fut.done():
                reply(fut.result().wire)  # type: ignore[operator]
            else:
                fut.add_done_callback(
                    lambda f: None if f.cancelled() else reply(f.result().wire)  # type: ignore[operator]
                )
        elif method == "GcsSubscriberCommandBatch":
            cmd_req = gcs_service_pb2.GcsSubscriberCommandBatchRequest.FromString(body)
            for cmd in cmd_req.commands:
                self.pub.subscribe(cmd_req.subscriber_id, cmd.channel_type, cmd.key_id)
            reply(b"")  # type: ignore[operator]
        elif method == "RegisterNode":
            node = gcs_service_pb2.RegisterNodeRequest.FromString(body).node_info
            self.pub.publish(GCS_NODE_INFO_CHANNEL, node.node_id, node)
            reply(b"")  # type: ignore[operator]
        else:  # GetClusterId and anything else the harness might ask
            reply(_CLUSTER_ID)  # type: ignore[operator]


class Connection(asyncio.Protocol):
    def __init__(self, app: App) -> None:
        self.app = app
        self.buf = bytearray()
        self.preface = False
        self.decoder = hpack.Decoder()
        self.paths: dict[int, str] = {}
        self.bodies: dict[int, bytearray] = {}
        self.block: bytearray | None = None
        self.block_stream = 0
        self.block_end = False
        self.unacked = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        settings = struct.pack(">HI", 0x3, 1 << 20)  # MAX_CONCURRENT_STREAMS
        self.transport.write(
            _frame(SETTINGS, 0, 0, settings)
            + _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        if not self.preface:
            if len(buf) < 24:
                return
            self.preface = True
            pos = 24
        end = len(buf)
        while end - pos >= 9:
            head, flags, sid = _HEADER.unpack_from(buf, pos)
            length, ftype = head >> 8, head & 0xFF
            if end - pos - 9 < length:
                break
            payload = bytes(buf[pos + 9 : pos + 9 + length])
            pos += 9 + length
            self.frame(ftype, flags, sid & 0x7FFFFFFF, payload)
        del buf[:pos]

    def frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == DATA:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            self.bodies.setdefault(sid, bytearray()).extend(payload)
            self.unacked += len(payload)
            if self.unacked > 1 << 20:  # keep the client's connection window open
                self.transport.write(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.unacked)))  # type: ignore[union-attr]
                self.unacked = 0
            if flags & END_STREAM:
                self.call(sid)
        elif ftype == HEADERS:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & PRIORITY:
                payload = payload[5:]
            if flags & END_HEADERS:
                self.headers(sid, payload, bool(flags & END_STREAM))
            else:
                self.block, self.block_stream, self.block_end = (
                    bytearray(payload),
                    sid,
                    bool(flags & END_STREAM),
                )
        elif ftype == CONTINUATION and self.block is not None:
            self.block += payload
            if flags & END_HEADERS:
                block, self.block = bytes(self.block), None
                self.headers(self.block_stream, block, self.block_end)
        elif ftype == SETTINGS and not flags & ACK:
            self.transport.write(_frame(SETTINGS, ACK, 0))  # type: ignore[union-attr]
        elif ftype == PING and not flags & ACK:
            self.transport.write(_frame(PING, ACK, 0, payload))  # type: ignore[union-attr]
        elif ftype == RST_STREAM:
            self.paths.pop(sid, None)
            self.bodies.pop(sid, None)
        elif ftype == GOAWAY and self.transport is not None:
            self.transport.close()

    def headers(self, sid: int, block: bytes, end_stream: bool) -> None:
        for name, value in self.decoder.decode(block, raw=True):
            if name == b":path":
                self.paths[sid] = value.decode()
                break
        if end_stream:
            self.call(sid)

    def call(self, sid: int) -> None:
        path = self.paths.pop(sid, "")
        body = bytes(self.bodies.pop(sid, b""))[5:]

        def reply(message: bytes) -> None:
            if self.transport is None or self.transport.is_closing():
                return
            data = b"\x00" + struct.pack(">I", len(message)) + message
            self.transport.write(
                _frame(HEADERS, END_HEADERS, sid, _RESPONSE_HEADERS)
                + _frame(DATA, 0, sid, data)
                + _frame(HEADERS, END_HEADERS | END_STREAM, sid, _TRAILERS)
            )

        self.app.handle(path, body, reply)


async def main(port: int) -> None:
    app = App()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(app), "127.0.0.1", port, backlog=4096)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
