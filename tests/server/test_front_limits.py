"""Conformance of the front server's HTTP/2 layer (gcs.front.h2) to the limits of a
public server, frames fed as bytes: nghttp2's rapid-reset, glitch, CONTINUATION, SETTINGS
and outbound-ACK limits, grpc C-core's ping policy, the server-wide byte budget, replies
written in pieces, stream states.  Rate limits run on an injected FakeClock."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import hpack
import pytest

from gcs.base.clock import FakeClock
from gcs.front.budget import ByteBudget
from gcs.front.h2 import INPUT_FLOOR, OUTPUT_FLOOR, H2Limits, H2ServerConnection, Stream
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
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    RST_STREAM,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    frame,
)
from tests.server.test_front_h2 import PATH, FakeTransport, RecordingApp, frames

CANCEL = struct.pack(">I", 0x8)


class Client:
    """A client side on an in-memory transport, with its own HPACK state and a fake clock."""

    def __init__(
        self,
        limits: H2Limits | None = None,
        *,
        budget: ByteBudget | None = None,
        clock: FakeClock | None = None,
        release: bool = True,
        transport: FakeTransport | None = None,
    ) -> None:
        self.clock = clock or FakeClock()
        self.app = RecordingApp(release=release)
        self.conn = H2ServerConnection(
            self.app, limits or H2Limits(), budget=budget, clock=self.clock
        )
        self.transport = transport or FakeTransport()
        self.conn.connection_made(self.transport)
        self.encoder = hpack.Encoder()
        self.feed(PREFACE + frame(SETTINGS, 0, 0))
        self.sent()

    def feed(self, data: bytes) -> None:
        self.conn.data_received(data)

    def block(self) -> bytes:
        return self.encoder.encode([(":method", "POST"), (":path", PATH.decode())])

    def open(self, sid: int, *, end: bool = False) -> None:
        flags = END_HEADERS | (END_STREAM if end else 0)
        self.feed(frame(HEADERS, flags, sid, self.block()))

    def sent(self) -> list[tuple[int, int, int, bytes]]:
        out = frames(self.transport.out)
        self.transport.out.clear()
        return out

    def goaway(self) -> int | None:
        codes = [struct.unpack(">II", p[:8])[1] for t, _, _, p in self.sent() if t == GOAWAY]
        return codes[-1] if codes else None


# ---- rapid reset ---------------------------------------------------------------------------


async def test_stream_resets_beyond_the_burst_get_enhance_your_calm() -> None:
    client = Client(H2Limits(reset_burst=50, reset_rate=10.0))
    for i in range(50):
        sid = 2 * i + 1
        client.open(sid)
        client.feed(frame(RST_STREAM, 0, sid, CANCEL))
    assert client.goaway() is None and not client.conn.closed
    client.clock.advance(0.5)  # 5 tokens back
    for i in range(50, 55):
        sid = 2 * i + 1
        client.open(sid)
        client.feed(frame(RST_STREAM, 0, sid, CANCEL))
    assert client.goaway() is None
    client.open(111)
    client.feed(frame(RST_STREAM, 0, 111, CANCEL))
    assert client.goaway() == ENHANCE_YOUR_CALM
    assert client.conn.closed and client.transport.closing


async def test_rapid_reset_in_one_read_stops_processing_at_the_limit() -> None:
    """One read carrying thousands of HEADERS+RST pairs: parsed a slice per loop turn, and
    the rest of the read is not processed once the limit is hit (no work goes on after the
    GOAWAY)."""
    client = Client()
    burst = b"".join(
        frame(HEADERS, END_HEADERS, 2 * i + 1, client.block())
        + frame(RST_STREAM, 0, 2 * i + 1, CANCEL)
        for i in range(3000)
    )
    client.feed(burst)
    assert len([e for e in client.app.events if e[0] == "request"]) == 256  # 512 frames a turn
    for _ in range(10):  # loop turns: the rest of the read is parsed 512 frames at a time
        await asyncio.sleep(0)
    assert client.goaway() == ENHANCE_YOUR_CALM
    requests = [e for e in client.app.events if e[0] == "request"]
    assert len(requests) == 1001  # the burst of 1000, then the one that found no token


async def test_reset_of_a_closed_stream_counts_too() -> None:
    client = Client(H2Limits(reset_burst=3, reset_rate=1.0))
    client.open(1, end=True)
    client.conn.send_reply(client.conn.streams[1], b"\x88", b"x", b"t")
    for _ in range(3):
        client.feed(frame(RST_STREAM, 0, 1, CANCEL))
    assert client.goaway() is None
    client.feed(frame(RST_STREAM, 0, 1, CANCEL))
    assert client.goaway() == ENHANCE_YOUR_CALM


# ---- CONTINUATION, SETTINGS entries, header list -------------------------------------------


async def test_eight_continuations_complete_a_block() -> None:
    client = Client()
    block = client.block()
    parts = [block[:1], *(block[1:] and [b""] * 7), block[1:]]
    client.feed(frame(HEADERS, 0, 1, parts[0]))
    for part in parts[1:-1]:
        client.feed(frame(CONTINUATION, 0, 1, part))
    client.feed(frame(CONTINUATION, END_HEADERS, 1, parts[-1]))
    assert client.app.events[0][0] == "request"
    assert client.goaway() is None


async def test_a_ninth_continuation_even_empty_gets_enhance_your_calm() -> None:
    client = Client()
    client.feed(frame(HEADERS, 0, 1, client.block()[:2]))
    for _ in range(8):
        client.feed(frame(CONTINUATION, 0, 1, b""))
    assert not client.conn.closed
    client.feed(frame(CONTINUATION, 0, 1, b""))
    assert client.goaway() == ENHANCE_YOUR_CALM


async def test_settings_with_too_many_entries() -> None:
    client = Client()
    entry = struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 65535)
    client.feed(frame(SETTINGS, 0, 0, entry * 32))
    assert (SETTINGS, ACK, 0, b"") in client.sent()
    client.feed(frame(SETTINGS, 0, 0, entry * 33))
    assert client.goaway() == ENHANCE_YOUR_CALM


async def test_header_block_above_the_header_list_size() -> None:
    client = Client(H2Limits(max_header_block=100))
    client.feed(frame(HEADERS, 0, 1, b"\x00" * 60) + frame(CONTINUATION, 0, 1, b"\x00" * 60))
    assert client.goaway() == ENHANCE_YOUR_CALM


# ---- PING policy (grpc C-core) -------------------------------------------------------------


async def test_ping_flood_on_an_idle_connection() -> None:
    """No stream open: a PING within two hours of the previous one is a strike; the third
    strike is too many (as C-core with max_ping_strikes 2)."""
    client = Client()
    for i in range(3):
        client.feed(frame(PING, 0, 0, b"%08d" % i))
    assert [t for t, _, _, _ in client.sent()] == [PING] * 3
    client.feed(frame(PING, 0, 0, b"00000003"))
    assert client.goaway() == ENHANCE_YOUR_CALM


async def test_pings_at_the_allowed_interval_with_a_call_open() -> None:
    client = Client(H2Limits(min_ping_interval_s=60.0))
    client.open(1)  # a call open: the interval is 60 s, not two hours
    for _ in range(10):
        client.feed(frame(PING, 0, 0, b"keepaliv"))
        client.clock.advance(60.0)
    assert client.goaway() is None and not client.conn.closed


async def test_a_reply_forgives_ping_strikes() -> None:
    """C-core forgives strikes whenever the server sends HEADERS or DATA (a client's BDP
    pings follow the server's data)."""
    client = Client()
    for i in range(20):
        sid = 2 * i + 1
        client.open(sid, end=True)
        client.conn.send_reply(client.conn.streams[sid], b"\x88", b"reply", b"t")
        client.feed(frame(PING, 0, 0, b"bdp-ping"))
        client.feed(frame(PING, 0, 0, b"bdp-pin2"))
    assert client.goaway() is None


async def test_data_sent_as_the_window_opens_forgives_ping_strikes() -> None:
    """A client reading a large reply pings as data arrives (gRPC's BDP probe): the DATA
    written as its window opens forgives the strikes (before: GOAWAY too_many_pings in the
    middle of a 100 MiB read)."""
    client = Client()
    client.open(1, end=True)
    stream = client.conn.streams[1]
    client.feed(frame(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 1000)))
    client.conn.send_reply(stream, b"\x88", b"r" * 20_000, b"t")
    for i in range(15):
        client.feed(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1000)))
        client.feed(frame(PING, 0, 0, b"bdp%05d" % i))
    assert client.goaway() is None and not client.conn.closed


async def test_ping_acks_are_not_counted() -> None:
    client = Client()
    for _ in range(100):
        client.feed(frame(PING, ACK, 0, b"gcs-kalv"))
    assert client.goaway() is None


# ---- glitches: empty DATA, PRIORITY, unknown frames, SETTINGS floods ------------------------


@pytest.mark.parametrize(
    "glitch",
    [
        frame(DATA, 0, 1, b""),
        frame(PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10"),
        frame(0x42, 0, 0, b"unknown"),
    ],
    ids=["empty DATA", "PRIORITY", "unknown type"],
)
async def test_glitches_beyond_the_burst_get_enhance_your_calm(glitch: bytes) -> None:
    clock = FakeClock()
    client = Client(H2Limits(glitch_burst=20, glitch_rate=10.0), clock=clock)
    client.open(1)
    for _ in range(20):
        client.feed(glitch)
    assert client.goaway() is None
    clock.advance(1.0)  # 10 more
    for _ in range(10):
        client.feed(glitch)
    assert client.goaway() is None
    client.feed(glitch)
    assert client.goaway() == ENHANCE_YOUR_CALM


async def test_settings_beyond_the_burst_get_enhance_your_calm() -> None:
    clock = FakeClock()
    client = Client(H2Limits(settings_burst=20, settings_rate=10.0), clock=clock)
    settings = frame(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 65535))
    for _ in range(19):  # the client's first SETTINGS took one token
        client.feed(settings)
    assert client.goaway() is None
    clock.advance(1.0)
    for _ in range(10):
        client.feed(settings)
    assert client.goaway() is None
    client.feed(settings)
    assert client.goaway() == ENHANCE_YOUR_CALM


async def test_empty_data_with_end_stream_is_no_glitch() -> None:
    client = Client(H2Limits(glitch_burst=2))
    for i in range(10):
        client.open(2 * i + 1)
        client.feed(frame(DATA, END_STREAM, 2 * i + 1, b""))
    assert client.goaway() is None


async def test_acks_to_a_peer_that_does_not_read() -> None:
    """nghttp2's outbound ACK limit: PING/SETTINGS ACKs written while the socket does not
    drain."""
    client = Client(H2Limits(max_outbound_acks=5, max_ping_strikes=0))
    client.conn.pause_writing()
    for _ in range(5):
        client.feed(frame(PING, 0, 0, b"12345678"))
    assert not client.conn.closed
    client.feed(frame(SETTINGS, 0, 0))
    assert client.goaway() == ENHANCE_YOUR_CALM
    client2 = Client(H2Limits(max_outbound_acks=5, max_ping_strikes=0))
    client2.conn.pause_writing()
    for _ in range(5):
        client2.feed(frame(PING, 0, 0, b"12345678"))
    client2.conn.resume_writing()  # it read: the count starts again
    for _ in range(5):
        client2.feed(frame(PING, 0, 0, b"12345678"))
    assert not client2.conn.closed


# ---- the server-wide budget: input ---------------------------------------------------------


async def test_held_input_of_all_connections_closes_every_window() -> None:
    """Two connections whose app holds every byte, one budget of 300 KB: once the budget is
    used, neither gets connection credit beyond what it had."""
    budget = ByteBudget(300_000)
    limits = H2Limits(connection_window=100_000, stream_window=1 << 20)
    clients = [Client(limits, budget=budget, release=False) for _ in range(2)]
    sent = [0, 0]
    credit = [100_000, 100_000]
    for client in clients:
        for sid in (1, 3):  # two streams each: no single-stream pass
            client.open(sid)
    for _ in range(60):
        for i, client in enumerate(clients):
            for sid in (1, 3):
                chunk = min(16384, credit[i] - sent[i])
                if chunk <= 0:
                    continue
                client.feed(frame(DATA, 0, sid, b"x" * chunk))
                sent[i] += chunk
            credit[i] += sum(
                struct.unpack(">I", p)[0]
                for t, _, s, p in client.sent()
                if t == WINDOW_UPDATE and s == 0
            )
    held = sum(c.conn.buffered_input for c in clients)
    assert budget.used == held
    assert held <= 300_000 + 2 * 100_000  # the budget plus one window per connection
    assert sent == credit  # both ran out of window


async def test_a_connection_holding_nothing_keeps_a_small_window() -> None:
    budget = ByteBudget(10_000)
    hog = Client(H2Limits(connection_window=100_000), budget=budget, release=False)
    hog.open(1)
    hog.open(3)
    hog.feed(frame(DATA, 0, 1, b"x" * 16384) + frame(DATA, 0, 3, b"x" * 16384))
    assert budget.used > budget.limit
    small = Client(H2Limits(connection_window=100_000), budget=budget)  # releases at once
    window = 100_000
    for i in range(200):  # 200 x 1 KiB requests, far beyond its first window
        sid = 2 * i + 1
        assert window >= 1024, f"starved after {i} requests"
        small.open(sid)
        small.feed(frame(DATA, END_STREAM, sid, b"r" * 1024))
        window -= 1024
        window += sum(
            struct.unpack(">I", p)[0]
            for t, _, s, p in small.sent()
            if t == WINDOW_UPDATE and s == 0
        )
    assert window <= INPUT_FLOOR


async def test_one_large_message_passes_a_full_budget() -> None:
    """The budget is used by another connection; a single stream still gets its 400 KB
    through (the pass), and the pass goes back once it is consumed."""
    budget = ByteBudget(50_000)
    other = Client(H2Limits(connection_window=65_535), budget=budget, release=False)
    other.open(1)
    other.open(3)
    other.feed(frame(DATA, 0, 1, b"x" * 30_000) + frame(DATA, 0, 3, b"x" * 30_000))
    large = Client(H2Limits(connection_window=65_536), budget=budget, release=False)
    large.open(1)
    total, window = 0, 65_536
    while total < 400_000:
        chunk = min(16384, window)
        assert chunk > 0, "the single stream was starved"
        large.feed(frame(DATA, 0, 1, b"x" * chunk))
        total += chunk
        window -= chunk
        window += sum(
            struct.unpack(">I", p)[0]
            for t, _, s, p in large.sent()
            if t == WINDOW_UPDATE and s == 0
        )
    assert budget.input_pass is large.conn
    large.conn.release(large.conn.streams[1], total)
    assert budget.input_pass is None


async def test_credit_comes_back_when_the_budget_frees() -> None:
    budget = ByteBudget(40_000)
    limits = H2Limits(connection_window=65_536)
    holder = Client(limits, budget=budget, release=False)
    holder.open(1)
    holder.open(3)
    holder.feed(frame(DATA, 0, 1, b"x" * 16384) + frame(DATA, 0, 3, b"x" * 16384))
    waiting = Client(limits, budget=budget, release=False)
    waiting.open(1)
    waiting.open(3)
    for sid in (1, 3, 1, 3):
        waiting.feed(frame(DATA, 0, sid, b"y" * 8192))
    assert not [f for f in waiting.sent() if f[0] == WINDOW_UPDATE and f[2] == 0]
    holder.conn.release(holder.conn.streams[1], 16384)
    holder.conn.release(holder.conn.streams[3], 16384)
    await asyncio.sleep(0)  # the budget wakes waiting connections on the next loop turn
    assert [f for f in waiting.sent() if f[0] == WINDOW_UPDATE and f[2] == 0]


# ---- output: pieces, per-connection bound, the server-wide budget --------------------------


def _wide_open(client: Client) -> None:
    client.feed(
        frame(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 2**31 - 1))
        + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65535))
    )
    client.sent()


async def test_a_reply_waits_as_given_and_goes_out_as_the_socket_drains() -> None:
    client = Client(H2Limits(max_buffered_output=100_000))
    _wide_open(client)
    client.open(1, end=True)
    stream = client.conn.streams[1]
    reply = bytes(range(256)) * 4096  # 1 MiB, 10x the per-connection bound
    client.conn.pause_writing()
    client.conn.send_headers(stream, b"\x88")
    client.conn.send_data(stream, reply)
    client.conn.send_trailers(stream, b"t")
    assert client.conn.queued_output == len(reply)
    assert stream.out[0].obj is reply  # held, not copied
    assert not client.conn.closed  # one stream's reply may exceed the bound
    got = bytearray()
    while not client.conn.closed and 1 in client.conn.streams:
        client.conn.resume_writing()
        sent = client.sent()
        got += b"".join(p for t, _, _, p in sent if t == DATA)
        client.conn.pause_writing()
    got += b"".join(p for t, _, _, p in client.sent() if t == DATA)
    assert bytes(got) == reply
    assert client.conn.queued_output == 0


class UndrainedSocket(FakeTransport):
    """A socket whose peer reads nothing yet: every write waits in its buffer, and past the
    high-water mark the protocol is paused, as asyncio's socket transports do."""

    def __init__(self) -> None:
        super().__init__()
        self.high = 64 << 10
        self.protocol: H2ServerConnection | None = None
        self.largest_write = 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = high if high is not None else self.high

    def write(self, data: Any) -> None:
        super().write(data)
        self.largest_write = max(self.largest_write, len(data))
        self.buffer_size += len(data)
        if self.buffer_size > self.high and self.protocol is not None:
            self.protocol.pause_writing()


async def test_a_peer_allowing_huge_frames_still_gets_its_reply_in_socket_sized_writes() -> None:
    """grpc C-core allows 16 MiB frames and opens its windows wide: the reply still goes out
    in socket-sized writes, so a reply larger than the per-connection bound is read back
    (before: one 6 MiB DATA frame in one write, over the bound at once: GOAWAY "peer does not
    read its replies", 1 in 3 runs of test_front_attacks' 6 MiB read-back)."""
    socket = UndrainedSocket()
    client = Client(H2Limits(max_buffered_output=1 << 20), transport=socket)
    socket.protocol = client.conn
    client.feed(
        frame(
            SETTINGS,
            0,
            0,
            struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 2**31 - 1)
            + struct.pack(">HI", S_MAX_FRAME_SIZE, 2**24 - 1),
        )
        + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65535))
    )
    client.open(1, end=True)
    reply = bytes(range(256)) * (6 << 12)  # 6 MiB
    client.conn.send_reply(client.conn.streams[1], b"\x88", reply, b"t")
    assert not client.conn.closed
    assert client.goaway() is None
    assert socket.buffer_size <= 1 << 20
    assert socket.largest_write <= 512 << 10
    assert client.conn.queued_output > 0  # the rest waits for the socket to drain


async def test_many_unread_replies_on_one_connection_are_dropped() -> None:
    client = Client(H2Limits(max_buffered_output=100_000))
    _wide_open(client)
    client.conn.pause_writing()
    for sid in (1, 3):
        client.open(sid, end=True)
        client.conn.send_reply(client.conn.streams[sid], b"\x88", b"r" * 60_000, b"t")
    assert client.goaway() == ENHANCE_YOUR_CALM


async def test_the_server_wide_output_budget() -> None:
    budget = ByteBudget(3 * OUTPUT_FLOOR)
    reader = Client(budget=budget)
    other = Client(budget=budget)
    for client in (reader, other):
        _wide_open(client)
        client.conn.pause_writing()
        client.open(1, end=True)
    large = b"L" * (4 * OUTPUT_FLOOR)  # above the whole budget: one reply may take the pass
    assert reader.conn.can_queue(len(large))
    reader.conn.send_reply(reader.conn.streams[1], b"\x88", large, b"t")
    assert budget.output_pass is reader.conn and not reader.conn.closed
    assert not other.conn.can_queue(2 * OUTPUT_FLOOR)
    assert other.conn.can_queue(OUTPUT_FLOOR)
    other.conn.send_reply(other.conn.streams[1], b"\x88", b"o" * (2 * OUTPUT_FLOOR), b"t")
    assert other.goaway() == ENHANCE_YOUR_CALM  # would hold past the budget: dropped
    assert budget.used == len(large)
    reader.conn.close()
    assert budget.used == 0 and budget.output_pass is None


async def test_shared_replies_are_not_counted() -> None:
    budget = ByteBudget(OUTPUT_FLOOR)
    client = Client(budget=budget)
    _wide_open(client)
    client.conn.pause_writing()
    shared = b"s" * (4 * OUTPUT_FLOOR)
    client.open(1, end=True)
    client.conn.send_reply(client.conn.streams[1], b"\x88", shared, b"t", counted=False)
    assert budget.used == 0 and not client.conn.closed


# ---- connection end ------------------------------------------------------------------------


async def test_no_abort_of_a_transport_that_closed(monkeypatch: Any) -> None:
    """The delayed abort after a close is cancelled once the connection is lost (an abort on
    a closed socket transport raised AttributeError: 'NoneType' ... 'call_soon')."""
    from gcs.front import h2

    monkeypatch.setattr(h2, "_ABORT_AFTER_S", 0.0)
    monkeypatch.setattr(h2, "_LINGER_S", 0.0)

    class ClosedTransport(FakeTransport):
        lost = False

        def abort(self) -> None:
            if self.lost:
                raise AttributeError("'NoneType' object has no attribute 'call_soon'")
            super().abort()

    client = Client(H2Limits(max_buffered_output=10))
    transport = ClosedTransport()
    client.conn.transport = transport
    client.conn.abort(ENHANCE_YOUR_CALM, "peer does not read its replies")
    transport.lost = True
    client.conn.connection_lost(None)
    failures: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: failures.append(context))
    try:
        for _ in range(3):
            await asyncio.sleep(0)  # loop turns: a call_later(0) would have run
    finally:
        loop.set_exception_handler(None)
    assert failures == []
    assert not transport.aborted


async def test_abort_of_a_transport_that_does_not_flush(monkeypatch: Any) -> None:
    from gcs.front import h2

    monkeypatch.setattr(h2, "_ABORT_AFTER_S", 0.0)
    monkeypatch.setattr(h2, "_LINGER_S", 0.0)
    client = Client()
    client.conn.abort(ENHANCE_YOUR_CALM, "bye")
    for _ in range(3):
        await asyncio.sleep(0)
    assert client.transport.aborted


# ---- stream states and flow control --------------------------------------------------------


async def test_headers_on_a_closed_stream_id_is_a_connection_error() -> None:
    client = Client()
    client.open(3, end=True)
    client.conn.send_reply(client.conn.streams[3], b"\x88", b"x", b"t")
    client.sent()
    client.feed(frame(HEADERS, END_HEADERS | END_STREAM, 1, client.block()))
    assert client.goaway() == STREAM_CLOSED


async def test_data_after_end_stream_resets_the_stream() -> None:
    client = Client()
    client.open(1, end=True)
    client.feed(frame(DATA, 0, 1, b"late"))
    assert (RST_STREAM, 0, 1, struct.pack(">I", STREAM_CLOSED)) in client.sent()
    assert not client.conn.closed


async def test_window_update_of_zero_on_a_stream_resets_it() -> None:
    client = Client()
    client.open(1)
    client.feed(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 0)))
    assert (RST_STREAM, 0, 1, struct.pack(">I", PROTOCOL_ERROR)) in client.sent()
    assert client.app.events[-1] == ("reset", 1, None)


async def test_stream_window_above_the_maximum_resets_it() -> None:
    client = Client()
    client.open(1)
    client.feed(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 2**31 - 1)))
    assert (RST_STREAM, 0, 1, struct.pack(">I", FLOW_CONTROL_ERROR)) in client.sent()


async def test_stream_window_is_credited_as_data_is_consumed() -> None:
    client = Client(H2Limits(stream_window=1000))
    client.open(1)
    total = 0
    for _ in range(10):
        client.feed(frame(DATA, 0, 1, b"x" * 600))
        total += 600
    updates = [p for t, _, s, p in client.sent() if t == WINDOW_UPDATE and s == 1]
    assert sum(struct.unpack(">I", p)[0] for p in updates) + 1000 >= total


async def test_settings_initial_window_change_applies_to_open_streams() -> None:
    client = Client()
    client.open(1, end=True)
    stream: Stream = client.conn.streams[1]
    client.feed(frame(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 10)))
    client.sent()
    assert stream.send_window == 10
    client.conn.send_reply(stream, b"\x88", b"y" * 25, b"t")
    assert [len(p) for t, _, _, p in client.sent() if t == DATA] == [10]


async def test_settings_ack_precedes_frames_that_use_the_new_settings() -> None:
    """A client raising MAX_FRAME_SIZE (grpc C-core does) checks frames against what it saw
    acknowledged: our ACK must go out before the first larger DATA frame."""
    client = Client()
    client.open(1, end=True)
    client.feed(frame(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 0)))
    client.conn.send_reply(client.conn.streams[1], b"\x88", b"d" * 100_000, b"t")
    client.sent()
    client.feed(
        frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20))
        + frame(
            SETTINGS,
            0,
            0,
            struct.pack(">HI", S_MAX_FRAME_SIZE, 65536)
            + struct.pack(">HI", S_INITIAL_WINDOW_SIZE, 1 << 20),
        )
    )
    sent = client.sent()
    kinds = [(t, f, len(p)) for t, f, _, p in sent if t in (SETTINGS, DATA)]
    ack = kinds.index((SETTINGS, ACK, 0))
    first_large = next(i for i, (t, _, n) in enumerate(kinds) if t == DATA and n > 16384)
    assert ack < first_large, kinds


async def test_our_reply_then_rst_no_error_to_a_client_still_sending() -> None:
    client = Client()
    client.open(1)  # not ended
    client.conn.send_reply(client.conn.streams[1], b"\x88", b"x", b"t")
    sent = client.sent()
    assert sent[-1] == (RST_STREAM, 0, 1, struct.pack(">I", NO_ERROR))
