"""The front server's HTTP/2 layer (gcs.front.h2) fed bytes directly: framing, flow
control, bounds and connection errors, with a recording app and an in-memory transport."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import hpack
import pytest

from gcs.front.h2 import H2Limits, H2ServerConnection, Stream
from gcs.rpc.h2_frames import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    HEADERS,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    S_INITIAL_WINDOW_SIZE,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)

PATH = b"/ray.rpc.ControlPlanePubSubGcsService/GcsSubscriberPoll"
NATIVE_PATH = b"/ray.rpc.ObservabilityPubSubService/ReportJobError"


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closing = False
        self.aborted = False
        self.buffer_size = 0
        self.pieces: list[Any] = []

    def write(self, data: Any) -> None:
        self.out += data

    def writelines(self, list_of_data: Any) -> None:
        self.pieces = list(list_of_data)
        for data in self.pieces:
            self.out += data

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.buffer_size


class RecordingApp:
    def __init__(self, *, release: bool = True) -> None:
        self.events: list[tuple[str, int, Any]] = []
        self.bodies: dict[int, bytearray] = {}
        self.release = release

    def on_request(self, conn: H2ServerConnection, stream: Stream) -> None:
        self.events.append(("request", stream.id, dict(stream.headers)))
        self.bodies[stream.id] = bytearray()

    def on_data(self, conn: H2ServerConnection, stream: Stream, data: bytes) -> None:
        self.bodies[stream.id] += data
        if self.release:
            conn.release(stream, len(data))

    def on_end(self, conn: H2ServerConnection, stream: Stream) -> None:
        self.events.append(("end", stream.id, bytes(self.bodies[stream.id])))

    def on_reset(self, conn: H2ServerConnection, stream: Stream) -> None:
        self.events.append(("reset", stream.id, None))


def frames(data: bytes | bytearray) -> list[tuple[int, int, int, bytes]]:
    out = []
    pos = 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3])
        ftype, flags = data[pos + 3], data[pos + 4]
        sid = int.from_bytes(data[pos + 5 : pos + 9]) & 0x7FFFFFFF
        out.append((ftype, flags, sid, bytes(data[pos + 9 : pos + 9 + length])))
        pos += 9 + length
    assert pos == len(data), "trailing partial frame"
    return out


class Peer:
    """A client side: encodes headers with its own HPACK state."""

    def __init__(self, limits: H2Limits | None = None, *, release: bool = True) -> None:
        self.app = RecordingApp(release=release)
        self.conn = H2ServerConnection(self.app, limits or H2Limits())
        self.transport = FakeTransport()
        self.conn.connection_made(self.transport)
        self.encoder = hpack.Encoder()

    def feed(self, data: bytes) -> None:
        self.conn.data_received(data)

    def start(self, settings: bytes = b"") -> None:
        self.feed(PREFACE + frame(SETTINGS, 0, 0, settings))

    def header_block(self, path: bytes = PATH) -> bytes:
        return self.encoder.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path.decode()),
                (":authority", "gcs"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        )

    def request(self, sid: int, body: bytes = b"\x00\x00\x00\x00\x02ab") -> bytes:
        return frame(HEADERS, END_HEADERS, sid, self.header_block()) + frame(
            DATA, END_STREAM, sid, body
        )

    def sent(self) -> list[tuple[int, int, int, bytes]]:
        out = frames(self.transport.out)
        self.transport.out.clear()
        return out


def goaway_code(sent: list[tuple[int, int, int, bytes]]) -> int:
    payloads = [p for t, _, _, p in sent if t == GOAWAY]
    assert payloads, f"no GOAWAY in {sent}"
    return int(struct.unpack(">II", payloads[-1][:8])[1])


def connection_credit(sent: list[tuple[int, int, int, bytes]]) -> int:
    return sum(int.from_bytes(p) for t, _, sid, p in sent if t == WINDOW_UPDATE and sid == 0)


async def test_preface_settings_and_ack() -> None:
    peer = Peer()
    first = peer.sent()
    assert first[0][0] == SETTINGS and not first[0][1] & ACK  # the server's preface first
    peer.start()
    assert (SETTINGS, ACK, 0, b"") in peer.sent()


async def test_request_in_one_byte_reads() -> None:
    peer = Peer()
    data = PREFACE + frame(SETTINGS, 0, 0) + peer.request(1)
    for i in range(len(data)):
        peer.feed(data[i : i + 1])
    kinds = [(e[0], e[1]) for e in peer.app.events]
    assert kinds == [("request", 1), ("end", 1)]
    assert peer.app.events[0][2][b":path"] == PATH
    assert peer.app.events[1][2] == b"\x00\x00\x00\x00\x02ab"


async def test_continuation_padding_and_priority() -> None:
    peer = Peer()
    peer.start()
    block = peer.header_block()
    head, tail = block[:7], block[7:]
    padded = bytes((3,)) + b"\x00\x00\x00\x01\x10" + head + b"\x00" * 3  # pad + priority
    peer.feed(
        frame(HEADERS, PADDED | PRIORITY_FLAG, 1, padded)
        + frame(CONTINUATION, 0, 1, tail[:2])
        + frame(CONTINUATION, END_HEADERS, 1, tail[2:])
        + frame(DATA, PADDED | END_STREAM, 1, bytes((4,)) + b"body" + b"\x00" * 4)
    )
    assert peer.app.events[0][2][b":path"] == PATH
    assert peer.app.events[1] == ("end", 1, b"body")


async def test_frame_between_headers_and_continuation_is_a_protocol_error() -> None:
    peer = Peer()
    peer.start()
    peer.sent()
    block = peer.header_block()
    peer.feed(frame(HEADERS, 0, 1, block[:5]) + frame(PING, 0, 0, b"x" * 8))
    assert goaway_code(peer.sent()) == PROTOCOL_ERROR
    assert peer.transport.closing


async def test_ping_is_acked_with_its_payload() -> None:
    peer = Peer()
    peer.start()
    peer.sent()
    peer.feed(frame(PING, 0, 0, b"12345678"))
    assert peer.sent() == [(PING, ACK, 0, b"12345678")]


async def test_window_exhaustion_then_resume() -> None:
    peer = Peer()
    peer.start(struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 10))
    peer.feed(frame(HEADERS, END_HEADERS | END_STREAM, 1, peer.header_block()))
    peer.sent()
    stream = peer.conn.streams[1]
    peer.conn.send_reply(stream, b"\x88", b"x" * 25, b"trailers")
    sent = peer.sent()
    data = [p for t, _, _, p in sent if t == DATA]
    assert [len(p) for p in data] == [10]
    assert not [f for f in sent if f[0] == HEADERS and f[1] & END_STREAM], "trailers too early"
    peer.feed(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 10)))
    assert [len(p) for t, _, _, p in peer.sent() if t == DATA] == [10]
    peer.feed(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 100)))
    last = peer.sent()
    assert [len(p) for t, _, _, p in last if t == DATA] == [5]
    assert last[-1][0] == HEADERS and last[-1][1] & END_STREAM and last[-1][3] == b"trailers"
    assert 1 not in peer.conn.streams


async def test_corked_message_parts_reach_the_transport_uncopied() -> None:
    """A fan-out's message parts go to the transport's ``writelines`` as given (no join per
    stream, none for the whole cork), framed as one DATA frame per stream."""
    peer = Peer()
    peer.start()
    for sid in (1, 3):
        peer.feed(frame(HEADERS, END_HEADERS | END_STREAM, sid, peer.header_block()))
    peer.sent()
    conn = peer.conn
    body = b"v" * 5000
    conn.cork()
    for sid in (1, 3):
        conn.send_message_parts(conn.streams[sid], [b"\x00\x00\x00\x13\x88", body], 5005)
    conn.uncork()
    assert [piece is body for piece in peer.transport.pieces].count(True) == 2
    data = [(sid, p) for t, _, sid, p in peer.sent() if t == DATA]
    assert data == [(1, b"\x00\x00\x00\x13\x88" + body), (3, b"\x00\x00\x00\x13\x88" + body)]


async def test_message_parts_beyond_the_window_wait_like_any_data() -> None:
    peer = Peer()
    peer.start(struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 10))
    peer.feed(frame(HEADERS, END_HEADERS | END_STREAM, 1, peer.header_block()))
    peer.sent()
    stream = peer.conn.streams[1]
    peer.conn.cork()
    peer.conn.send_message_parts(stream, [b"ab", b"c" * 23], 25)
    peer.conn.uncork()
    assert [p for t, _, _, p in peer.sent() if t == DATA] == [b"ab" + b"c" * 8]
    peer.feed(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 100)))
    assert [p for t, _, _, p in peer.sent() if t == DATA] == [b"c" * 15]


async def test_connection_window_shared_by_streams() -> None:
    peer = Peer()
    peer.start()
    for sid in (1, 3):
        peer.feed(frame(HEADERS, END_HEADERS | END_STREAM, sid, peer.header_block()))
    peer.sent()
    conn = peer.conn
    conn.send_data(conn.streams[1], b"a" * 65535)  # the whole default connection window
    conn.send_data(conn.streams[3], b"b" * 10)
    assert sum(len(p) for t, _, _, p in peer.sent() if t == DATA) == 65535
    peer.feed(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 10)))
    assert [(sid, p) for t, _, sid, p in peer.sent() if t == DATA] == [(3, b"b" * 10)]


async def test_rst_stream_resets_a_held_stream() -> None:
    peer = Peer()
    peer.start()
    peer.feed(peer.request(1))
    assert 1 in peer.conn.streams  # held: not answered
    peer.feed(frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))
    assert peer.app.events[-1] == ("reset", 1, None)
    assert not peer.conn.streams
    peer.feed(frame(DATA, 0, 1, b"late"))  # in flight: ignored, not an error
    assert not [f for f in peer.sent() if f[0] == GOAWAY]


async def test_graceful_goaway_waits_for_open_streams() -> None:
    peer = Peer()
    peer.start()
    peer.feed(peer.request(1))
    peer.sent()
    peer.conn.goaway()
    sent = peer.sent()
    assert sent[0][0] == GOAWAY and struct.unpack(">II", sent[0][3][:8]) == (1, NO_ERROR)
    assert not peer.transport.closing
    peer.feed(peer.request(3))  # after GOAWAY: refused
    assert (RST_STREAM, 0, 3, struct.pack(">I", REFUSED_STREAM)) in peer.sent()
    peer.conn.send_reply(peer.conn.streams[1], b"\x88", b"reply", b"t")
    assert peer.transport.closing


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        PREFACE + b"\xff" * 64,
        PREFACE + frame(SETTINGS, 0, 0, b"12345"),
        PREFACE + frame(SETTINGS, 0, 0) + frame(DATA, 0, 0, b"x"),
        PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 2, b"\x88"),
        PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff"),
        PREFACE + frame(SETTINGS, 0, 0) + frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00"),
        PREFACE + frame(SETTINGS, 0, 0) + frame(DATA, PADDED, 1, b"\x09abc"),
    ],
)
async def test_garbage_gets_goaway_and_close_never_an_exception(garbage: bytes) -> None:
    peer = Peer()
    peer.sent()
    peer.feed(garbage)
    assert goaway_code(peer.sent()) != NO_ERROR
    assert peer.transport.closing and peer.conn.closed
    peer.feed(b"more")  # after close: ignored


async def test_max_concurrent_streams_refused() -> None:
    peer = Peer(H2Limits(max_concurrent_streams=2))
    peer.start()
    for sid in (1, 3, 5):
        peer.feed(frame(HEADERS, END_HEADERS, sid, peer.header_block()))
    assert (RST_STREAM, 0, 5, struct.pack(">I", REFUSED_STREAM)) in peer.sent()
    assert sorted(peer.conn.streams) == [1, 3]


async def test_data_beyond_the_stream_window_resets_the_stream() -> None:
    peer = Peer(H2Limits(stream_window=100))
    peer.start()
    peer.feed(frame(HEADERS, END_HEADERS, 1, peer.header_block()))
    peer.sent()
    peer.feed(frame(DATA, 0, 1, b"x" * 101))
    assert (RST_STREAM, 0, 1, struct.pack(">I", FLOW_CONTROL_ERROR)) in peer.sent()
    assert peer.app.events[-1] == ("reset", 1, None)
    assert not peer.conn.closed


async def test_data_beyond_the_connection_window_is_a_connection_error() -> None:
    peer = Peer(H2Limits(connection_window=65535, max_buffered_input=0), release=False)
    peer.start()
    for sid in (1, 3):
        peer.feed(frame(HEADERS, END_HEADERS, sid, peer.header_block()))
    peer.sent()
    for sid in (1, 3, 1, 3, 1):
        peer.feed(frame(DATA, 0, sid, b"x" * 16384))
    assert goaway_code(peer.sent()) == FLOW_CONTROL_ERROR
    assert peer.conn.closed


async def test_held_input_closes_the_connection_window() -> None:
    limits = H2Limits(connection_window=100_000, max_buffered_input=150_000, stream_window=1 << 20)
    peer = Peer(limits, release=False)  # the app holds every byte
    peer.start()
    for sid in (1, 3):
        peer.feed(frame(HEADERS, END_HEADERS, sid, peer.header_block()))
    peer.sent()
    credited = 0
    sent_bytes = 0
    for _ in range(40):
        for sid in (1, 3):
            chunk = min(16384, 100_000 + credited - sent_bytes)
            if chunk <= 0:
                break
            peer.feed(frame(DATA, 0, sid, b"x" * chunk))
            sent_bytes += chunk
        credited += sum(
            struct.unpack(">I", p)[0]
            for t, _, sid, p in peer.sent()
            if t == WINDOW_UPDATE and sid == 0
        )
    assert peer.conn.buffered_input <= 150_000 + 100_000  # the cap plus one window
    assert sent_bytes == 100_000 + credited  # the peer ran out of window
    assert not peer.conn.closed


async def test_one_large_message_still_gets_through() -> None:
    limits = H2Limits(connection_window=65_536, max_buffered_input=100_000)
    peer = Peer(limits, release=False)
    peer.start()
    peer.feed(frame(HEADERS, END_HEADERS, 1, peer.header_block()))
    peer.sent()
    total = 0
    window = 65_536
    while total < 400_000:
        chunk = min(16384, window)
        assert chunk > 0, "the single stream was starved"
        peer.feed(frame(DATA, 0, 1, b"x" * chunk))
        total += chunk
        window -= chunk
        window += sum(
            struct.unpack(">I", p)[0]
            for t, _, sid, p in peer.sent()
            if t == WINDOW_UPDATE and sid == 0
        )
    assert not peer.conn.closed


async def test_a_peer_that_does_not_read_is_dropped() -> None:
    peer = Peer(H2Limits(max_buffered_output=1000))
    peer.start()
    peer.feed(frame(HEADERS, END_HEADERS, 1, peer.header_block()))
    peer.conn.pause_writing()
    peer.transport.buffer_size = 5000
    peer.feed(frame(PING, 0, 0, b"12345678"))
    assert goaway_code(peer.sent()) == ENHANCE_YOUR_CALM
    assert peer.app.events[-1] == ("reset", 1, None)


async def test_oversized_header_block_is_refused() -> None:
    peer = Peer(H2Limits(max_header_block=1000))
    peer.start()
    peer.sent()
    peer.feed(frame(HEADERS, 0, 1, b"\x00" * 900) + frame(CONTINUATION, 0, 1, b"\x00" * 900))
    assert goaway_code(peer.sent()) == ENHANCE_YOUR_CALM


async def test_app_exception_is_internal_error_not_a_crash() -> None:
    peer = Peer()

    def boom(conn: H2ServerConnection, stream: Stream) -> None:
        raise RuntimeError("bug")

    peer.app.on_request = boom  # type: ignore[method-assign]
    peer.start()
    peer.sent()
    peer.feed(peer.request(1))
    assert goaway_code(peer.sent()) == 0x2
    assert peer.conn.closed


async def test_keepalive_pings_a_silent_peer_then_drops_it() -> None:
    peer = Peer()
    peer.start()
    peer.sent()
    conn = peer.conn
    conn.keepalive_tick(0.0, 20.0)  # the peer was just heard
    assert peer.sent() == []
    conn.keepalive_tick(10.0, 20.0)
    [(ftype, flags, _, payload)] = peer.sent()
    assert ftype == PING and not flags & ACK
    peer.feed(frame(PING, ACK, 0, payload))  # answered: alive
    conn.keepalive_tick(20.0, 20.0)
    conn.keepalive_tick(30.0, 20.0)
    assert [f[0] for f in peer.sent()] == [PING]
    conn.keepalive_tick(45.0, 20.0)
    assert not conn.closed
    conn.keepalive_tick(50.0, 20.0)  # unanswered for 20 s
    assert conn.closed and peer.transport.closing


async def test_repeated_indexed_header_blocks_follow_table_changes() -> None:
    """A re-poll's all-indexed block is decoded once; a block that changes the table
    invalidates what was cached (the same bytes may then mean other headers)."""
    peer = Peer()
    peer.start()
    enc = peer.encoder
    headers = [(":method", "POST"), (":path", "/a"), ("x-k", "one")]
    first = enc.encode(headers)
    again = enc.encode(headers)
    assert all(b & 0x80 for b in again)  # all indexed
    # a new entry shifts the dynamic indices: the same bytes then name other headers
    shift = enc.encode([(":path", "/b"), ("x-k", "two")])
    blocks = [first, again, again, shift, again]
    for i, block in enumerate(blocks):
        peer.feed(frame(HEADERS, END_HEADERS | END_STREAM, 2 * i + 1, block))
    reference = hpack.Decoder()
    expected = [dict(reference.decode(b, raw=True)) for b in blocks]  # type: ignore[arg-type]
    got = [e[2] for e in peer.app.events if e[0] == "request"]
    assert got == expected
    assert expected[4] != expected[1]  # the cache must not have answered the last one


def test_keeps_table_matches_what_decoding_does() -> None:
    """``_keeps_table`` says True only for blocks whose decoding leaves the dynamic table
    as it was (over random header lists, Huffman on and off, sensitive fields)."""
    import random

    from gcs.front.h2_input import _keeps_table
    from gcs.rpc.h2_frames import literal, literal_new

    rng = random.Random(5)
    encoder, decoder = hpack.Encoder(), hpack.Decoder()
    seen_true = seen_false = 0
    for _ in range(300):
        headers = [
            hpack.HeaderTuple(f"k{rng.randrange(6)}", "v" * rng.randrange(0, 200))
            if rng.random() < 0.7
            else hpack.NeverIndexedHeaderTuple(f"s{rng.randrange(3)}", "x" * rng.randrange(200))
            for _ in range(rng.randrange(1, 5))
        ]
        block = encoder.encode(headers, huffman=rng.random() < 0.5)
        before = list(decoder.header_table.dynamic_entries)
        decoder.decode(block)
        unchanged = list(decoder.header_table.dynamic_entries) == before
        if _keeps_table(block):
            assert unchanged, block.hex()
            seen_true += 1
        else:
            seen_false += 1
    assert seen_true and seen_false
    c_core_like = b"\xc3\xc2\x83" + literal_new("ray_cluster_id", "ab" * 28) + literal(4, "/p")
    assert _keeps_table(c_core_like)
    assert not _keeps_table(b"\x3f\xe1\x1f")  # a dynamic table size update
    assert not _keeps_table(b"\x00\x7f")  # truncated


@pytest.mark.parametrize("seed", range(4))
async def test_random_frames_never_hit_an_internal_error(seed: int) -> None:
    """Seeded random frame sequences (valid and invalid types, flags, stream ids, payloads,
    real request headers among them) through the real router with the pubsub methods: each
    connection stays up or ends with a protocol-level GOAWAY, never INTERNAL_ERROR (a bug)."""
    import random

    from gcs.base.clock import SystemClock
    from gcs.front import Forwarder, GrpcRouter, hot_methods, native_methods
    from gcs.rpc.interceptors import CallGuard
    from gcs.rpc.method_paths import method_path
    from gcs.services.pubsub_runtime import GcsPubSub

    rng = random.Random(seed)
    pubsub = GcsPubSub.create(SystemClock())
    forwarder = Forwarder("unix:/nonexistent/gcs.sock", 1 << 20)
    servicers = pubsub.servicers()
    paths = [method_path(m) for d, _ in servicers for m in d.methods]
    router = GrpcRouter(
        hot_methods(servicers, 4096),
        native_methods(pubsub.handlers(servicers=servicers), paths),
        CallGuard(None, None),
        forwarder,
        on_call=None,
        max_message_bytes=1 << 20,
    )
    for _ in range(60):
        conn = H2ServerConnection(router, H2Limits(max_concurrent_streams=8))
        transport = FakeTransport()
        conn.connection_made(transport)
        enc = hpack.Encoder()
        data = bytearray(PREFACE + frame(SETTINGS, 0, 0))
        for _ in range(rng.randrange(1, 30)):
            sid = rng.choice([0, 1, 3, 5, 2, rng.randrange(1 << 31)])
            if rng.random() < 0.4:
                path = rng.choice(
                    [PATH, PATH.replace(b"Poll", b"CommandBatch"), NATIVE_PATH, b"/x/y"]
                )
                block = enc.encode([(":method", "POST"), (":path", path.decode())])
                flags = rng.choice([END_HEADERS, END_HEADERS | END_STREAM, 0])
                data += frame(HEADERS, flags, sid | 1, block)
            else:
                ftype = rng.randrange(12)
                payload = rng.randbytes(rng.choice([0, 1, 4, 5, 8, 9, 40, 300]))
                data += frame(ftype, rng.randrange(256), sid, payload)
        cut = rng.randrange(1, len(data))
        conn.data_received(bytes(data[:cut]))
        conn.data_received(bytes(data[cut:]))
        codes = [
            struct.unpack(">II", p[:8])[1] for t, _, _, p in frames(transport.out) if t == GOAWAY
        ]
        assert 0x2 not in codes, f"seed {seed}: internal error"
        conn.close()
    await router.close()
    await forwarder.close()
    await pubsub.stop()
