"""The server side of HTTP/2 (RFC 9113) for the front server: frames, streams, flow control,
and the limits a server on a public port needs.

It knows nothing of gRPC.  A :class:`StreamApp` receives each stream's decoded request
headers, its DATA payloads, its end and its reset; it answers through
:meth:`H2ServerConnection.send_headers` / :meth:`send_data` / :meth:`send_trailers` /
:meth:`send_reply` (one burst: HEADERS + DATA + trailers) and :meth:`reset`.

* Preface, SETTINGS (acked), PING (acked), PRIORITY (ignored), GOAWAY from the peer (no new
  streams; closed once the open ones finish), PADDED and PRIORITY flags, CONTINUATION.
* Output respects the peer's connection and stream windows and its SETTINGS_MAX_FRAME_SIZE,
  and is written in pieces while the socket drains (``pause_writing`` / ``resume_writing``):
  a reply of any size is held once, as the app gave it, and read by a normal client at its
  own pace; trailers follow the stream's data.
* Input is bounded: header blocks (``max_header_block`` bytes in at most
  ``max_continuations`` CONTINUATION frames), concurrent streams (more are refused with
  REFUSED_STREAM), and bytes held: the app reports what it stops holding (:meth:`release`);
  connection credit is granted while the connection holds at most ``max_buffered_input``
  (or a single stream holds everything, so one large message still gets through) and the
  server-wide :class:`~gcs.rpc.front.budget.ByteBudget` has room.  A peer sending beyond its
  window gets FLOW_CONTROL_ERROR.
* Output waiting on a peer that does not read is bounded by ``max_buffered_output`` per
  connection (one stream may hold more: one large reply being read) and by the server-wide
  budget; beyond either the connection is dropped (GOAWAY ENHANCE_YOUR_CALM).
* Floods end the connection with GOAWAY ENHANCE_YOUR_CALM, with nghttp2's and grpc C-core's
  limits (:mod:`gcs.rpc.front.ratelimit`): RST_STREAM beyond ``reset_burst`` + ``reset_rate``/s
  (rapid reset); "glitches" (empty DATA without END_STREAM, PRIORITY, unknown frame types,
  DATA after END_STREAM) beyond ``glitch_burst`` + ``glitch_rate``/s; SETTINGS frames beyond
  ``settings_burst`` + ``settings_rate``/s; PINGs
  closer than ``min_ping_interval_s`` more than ``max_ping_strikes`` times (C-core's policy,
  forgiven whenever we send HEADERS or DATA); SETTINGS with more than
  ``max_settings_entries`` entries; ``max_outbound_acks`` PING/SETTINGS ACKs written to a
  peer that does not read.
* Malformed input is a connection error: GOAWAY with the RFC's code, then close; an
  exception inside the app is logged and treated as INTERNAL_ERROR -- never a crash.
* We never index into the peer's HPACK table (our header blocks are literals without
  indexing), so the peer's SETTINGS_HEADER_TABLE_SIZE does not concern us.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import hpack
import structlog

from gcs.clock import Clock, SystemClock
from gcs.rpc.front.budget import ByteBudget
from gcs.rpc.front.ratelimit import PingPolicy, TokenBucket
from gcs.rpc.h2wire import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_HEADER,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INTERNAL_ERROR,
    MAX_FRAME_SIZE,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_CONCURRENT_STREAMS,
    S_MAX_FRAME_SIZE,
    S_MAX_HEADER_LIST_SIZE,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    frame,
    frame_header,
)
from gcs.rpc.warnings import WarningSampler

log = structlog.get_logger("gcs.rpc.front")

Header = tuple[bytes, bytes]
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
_KEEPALIVE_PING = b"gcs-kalv"
_BLOCK_CACHE_MAX = 32
_ABORT_AFTER_S = 5.0
"""A connection closed after an error is aborted if its last bytes cannot be flushed."""
_LINGER_S = 1.0
_LINGER_BYTES = 256 << 10
"""After a GOAWAY for an error, the peer's further bytes are read and dropped for at most
this long and this many bytes (a client stops at the GOAWAY; a flood does not)."""
INPUT_FLOOR = DEFAULT_WINDOW
"""Connection credit a connection holding (almost) nothing always gets, whatever the
server-wide budget: small requests keep flowing while others' large ones wait."""
OUTPUT_FLOOR = 1 << 20
"""Reply bytes a connection may have waiting whatever the server-wide budget."""
_FAST_REPLY_MAX = 256 << 10
"""Larger replies go out in pieces as the socket drains, never whole into its buffer."""
_FRAMES_PER_TURN = 512
"""Frames parsed per connection per event-loop turn (then reading pauses for a turn)."""
_WRITE_BATCH = 256 << 10
_WRITE_HIGH_WATER = 512 << 10
"""The socket buffer above which we stop writing DATA (``pause_writing``)."""


@dataclass(frozen=True, slots=True)
class H2Limits:
    max_concurrent_streams: int = 4096
    stream_window: int = 1 << 20
    """Our SETTINGS_INITIAL_WINDOW_SIZE: what a client may send on a stream unacknowledged."""
    connection_window: int = 16 << 20
    max_buffered_input: int = 64 << 20
    max_buffered_output: int = 64 << 20
    max_header_block: int = 64 << 10
    """SETTINGS_MAX_HEADER_LIST_SIZE, and the largest encoded header block."""
    max_continuations: int = 8
    """CONTINUATION frames after one HEADERS (nghttp2's default; empty ones count)."""
    max_settings_entries: int = 32
    """Entries in one SETTINGS frame (nghttp2's default)."""
    reset_burst: int = 1000
    reset_rate: float = 33.0
    """RST_STREAM frames from the peer: ``reset_burst`` at once, then ``reset_rate`` per
    second (nghttp2's stream reset rate limit)."""
    glitch_burst: int = 10_000
    glitch_rate: float = 330.0
    """Suspicious frames (nghttp2's glitch rate limit)."""
    settings_burst: int = 100
    settings_rate: float = 10.0
    """SETTINGS frames, each to be acknowledged: a client sends a handful (stricter than
    nghttp2, which bounds only the ACKs a non-reading peer leaves queued)."""
    min_ping_interval_s: float = 60.0
    max_ping_strikes: int = 2
    """grpc C-core's ping policy with Ray's ``gcs_server`` setting (1 min; 0 strikes = no
    limit)."""
    max_outbound_acks: int = 1000
    """PING / SETTINGS ACKs written while the peer does not read (nghttp2's default)."""


class Stream:
    """One request stream; ``app`` is the :class:`StreamApp`'s own state for it."""

    __slots__ = (
        "app",
        "buffered",
        "counted",
        "headers",
        "id",
        "out",
        "out_len",
        "recv_window",
        "remote_closed",
        "send_window",
        "trailers",
    )

    def __init__(self, stream_id: int, headers: list[Header], send_window: int, window: int):
        self.id = stream_id
        self.headers = headers
        self.recv_window = window
        self.send_window = send_window
        self.remote_closed = False
        self.buffered = 0
        self.out: deque[memoryview] | None = None
        """Data waiting for the windows or the socket, held as given (made when needed)."""
        self.out_len = 0
        self.counted = 0
        """Of ``out_len``, the bytes counted in the server-wide budget."""
        self.trailers: bytes | None = None
        self.app: Any = None


class StreamApp(Protocol):
    def on_request(self, conn: H2ServerConnection, stream: Stream) -> None:
        """Request headers decoded; the stream may be answered right away."""

    def on_data(self, conn: H2ServerConnection, stream: Stream, data: bytes) -> None:
        """DATA payload (padding removed); counted as held until :meth:`release`."""

    def on_end(self, conn: H2ServerConnection, stream: Stream) -> None:
        """The client finished sending (END_STREAM)."""

    def on_reset(self, conn: H2ServerConnection, stream: Stream) -> None:
        """The stream ended without our trailers (client RST_STREAM, connection lost)."""


class _ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class H2ServerConnection(asyncio.Protocol):
    """One client connection.  Slotted: at 2,000 subscriber connections a publish touches
    each once, and a dict of 40-odd attributes per connection cost ~0.6 µs per reply."""

    __slots__ = (
        "_abort_timer",
        "_acks",
        "_acks_while_paused",
        "_block_cache",
        "_blocked",
        "_budget",
        "_buf",
        "_buffered",
        "_buffering_streams",
        "_clock",
        "_cont_block",
        "_cont_count",
        "_cont_end",
        "_cont_sid",
        "_cork",
        "_counted_out",
        "_decoder",
        "_glitches",
        "_heard",
        "_last_sid",
        "_lingered",
        "_on_closed",
        "_parse_deferred",
        "_paused",
        "_peer_goaway",
        "_peer_max_frame",
        "_peer_stream_window",
        "_ping_sent_at",
        "_pings",
        "_preface_left",
        "_queued_out",
        "_recv_window",
        "_resets",
        "_send_window",
        "_sent_since_ping",
        "_settings",
        "_warnings",
        "app",
        "closed",
        "going_away",
        "limits",
        "streams",
        "transport",
    )

    def __init__(
        self,
        app: StreamApp,
        limits: H2Limits,
        on_closed: Callable[[H2ServerConnection], None] | None = None,
        *,
        budget: ByteBudget | None = None,
        clock: Clock | None = None,
        warnings: WarningSampler | None = None,
    ) -> None:
        self.app = app
        self.limits = limits
        self._on_closed = on_closed
        self._budget = budget if budget is not None else ByteBudget(1 << 62)
        self._clock = clock if clock is not None else SystemClock()
        self._warnings = warnings
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.going_away = False
        self._buf = bytearray()
        self._preface_left = len(PREFACE)
        self._decoder = hpack.Decoder(max_header_list_size=limits.max_header_block)
        self._decoder.max_allowed_table_size = 4096
        self.streams: dict[int, Stream] = {}
        self._last_sid = 0
        self._cont_sid = 0
        self._cont_block = bytearray()
        self._cont_end = False
        self._cont_count = 0
        self._recv_window = 0
        self._buffered = 0
        self._buffering_streams = 0
        self._send_window = DEFAULT_WINDOW
        self._peer_stream_window = DEFAULT_WINDOW
        self._peer_max_frame = MAX_FRAME_SIZE
        self._blocked: dict[int, Stream] = {}
        self._queued_out = 0
        self._counted_out = 0
        self._paused = False
        self._acks_while_paused = 0
        self._acks: list[bytes] = []
        self._cork: list[bytes] | None = None
        self._peer_goaway = False
        self._heard = True
        self._ping_sent_at: float | None = None
        self._block_cache: dict[bytes, list[Header]] = {}
        now = self._clock.monotonic_s()
        self._resets = TokenBucket(limits.reset_burst, limits.reset_rate, now)
        self._glitches = TokenBucket(limits.glitch_burst, limits.glitch_rate, now)
        self._settings = TokenBucket(limits.settings_burst, limits.settings_rate, now)
        self._pings = PingPolicy(limits.min_ping_interval_s, limits.max_ping_strikes)
        self._sent_since_ping = False
        self._abort_timer: asyncio.TimerHandle | None = None
        self._parse_deferred = False
        self._lingered = 0

    # ------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        with contextlib.suppress(NotImplementedError):  # a test transport
            transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        lim = self.limits
        settings = b"".join(
            _SETTING.pack(ident, value)
            for ident, value in (
                (S_MAX_CONCURRENT_STREAMS, lim.max_concurrent_streams),
                (S_INITIAL_WINDOW_SIZE, lim.stream_window),
                (S_MAX_HEADER_LIST_SIZE, lim.max_header_block),
                (S_ENABLE_PUSH, 0),
            )
        )
        out = frame(SETTINGS, 0, 0, settings)
        self._recv_window = DEFAULT_WINDOW
        if lim.connection_window > DEFAULT_WINDOW:
            out += frame(WINDOW_UPDATE, 0, 0, _U32.pack(lim.connection_window - DEFAULT_WINDOW))
            self._recv_window = lim.connection_window
        transport.write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        timer, self._abort_timer = self._abort_timer, None
        if timer is not None:  # nothing left to abort (and the transport has no loop now)
            timer.cancel()
        self._teardown()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._acks_while_paused = 0
        if self._blocked and not self.closed:
            self._flush_blocked()

    def data_received(self, data: bytes) -> None:
        if self.closed:  # lingering after a GOAWAY: dropped, up to a bound
            self._lingered += len(data)
            if self._lingered > _LINGER_BYTES and self.transport is not None:
                self.transport.abort()
            return
        self._heard = True
        self._ping_sent_at = None
        self._buf += data
        if not self._parse_deferred:
            self._parse()

    def _parse(self) -> None:
        """Frames in the buffer, at most ``_FRAMES_PER_TURN`` per event-loop turn: a read
        full of tiny frames (a flood) must not hold the loop that serves everyone else."""
        buf = self._buf
        pos = 0
        left = _FRAMES_PER_TURN
        try:
            if self._preface_left:
                done = len(PREFACE) - self._preface_left
                take = min(self._preface_left, len(buf))
                if buf[:take] != PREFACE[done : done + take]:
                    raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._preface_left -= take
                pos = take
                if self._preface_left:
                    del buf[:pos]
                    return
            end = len(buf)
            while end - pos >= 9:
                head, flags, sid = FRAME_HEADER.unpack_from(buf, pos)
                length = head >> 8
                if length > MAX_FRAME_SIZE:
                    raise _ConnectionError(FRAME_SIZE_ERROR, f"{length}-byte frame")
                if end - pos - 9 < length:
                    break
                if not left:
                    self._defer_parse()
                    break
                left -= 1
                payload = bytes(buf[pos + 9 : pos + 9 + length])
                pos += 9 + length
                self._on_frame(head & 0xFF, flags, sid & 0x7FFFFFFF, payload)
                if self.closed:
                    return
        except _ConnectionError as err:
            self.abort(err.code, str(err))
            return
        except Exception:  # a bug in us or the app must not take the loop down
            log.exception("front.connection_failed")
            self.abort(INTERNAL_ERROR, "internal error")
            return
        finally:
            if self._acks:
                self._write(b"")
        del buf[:pos]

    def _defer_parse(self) -> None:
        """Stop reading; parse the rest of the buffer on the next loop turn."""
        self._parse_deferred = True
        if self.transport is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self.transport.pause_reading()
        asyncio.get_running_loop().call_soon(self._parse_later)

    def _parse_later(self) -> None:
        self._parse_deferred = False
        if self.closed:
            return
        self._parse()
        if not self._parse_deferred and not self.closed and self.transport is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self.transport.resume_reading()

    # ------------------------------------------------------------- frames in

    def _glitch(self, what: str) -> None:
        """A frame a well-behaved peer has little reason to send often."""
        if not self._glitches.take(self._clock.monotonic_s()):
            raise _ConnectionError(ENHANCE_YOUR_CALM, f"too many suspicious frames ({what})")

    def _on_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if self._cont_sid and ftype != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "expected CONTINUATION")
        if ftype == HEADERS:
            self._on_headers(flags, sid, payload)
        elif ftype == DATA:
            self._on_data(flags, sid, payload)
        elif ftype == CONTINUATION:
            self._on_continuation(flags, sid, payload)
        elif ftype == WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif ftype == PING:
            self._on_ping(flags, sid, payload)
        elif ftype == SETTINGS:
            self._on_settings(flags, sid, payload)
        elif ftype == RST_STREAM:
            self._on_rst_stream(sid, payload)
        elif ftype == GOAWAY:
            if sid != 0:
                raise _ConnectionError(PROTOCOL_ERROR, "GOAWAY on a stream")
            self._peer_goaway = True
            if not self.streams:
                self.close()
        elif ftype == PRIORITY:
            if sid == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "PRIORITY on stream 0")
            self._glitch("PRIORITY")
        elif ftype == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        else:  # unknown frame types are ignored (RFC 9113 section 4.1)
            self._glitch("unknown frame type")

    def _on_ping(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise _ConnectionError(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise _ConnectionError(FRAME_SIZE_ERROR, "PING payload is not 8 bytes")
        if flags & ACK:
            return
        if self._sent_since_ping:
            self._sent_since_ping = False
            self._pings.forgive()
        if self._pings.received(self._clock.monotonic_s(), idle=not self.streams):
            raise _ConnectionError(ENHANCE_YOUR_CALM, "too_many_pings")
        self._write_ack(frame(PING, ACK, 0, payload))

    def _write_ack(self, data: bytes) -> None:
        """ACKs of one read go out in one write, at the end of its parse or before the next
        frame written (a SETTINGS flood cost one send per frame; a SETTINGS ACK must precede
        frames that use the new settings: a client raising MAX_FRAME_SIZE rejects larger
        frames that arrive before our ACK)."""
        if self._paused:
            self._acks_while_paused += 1
            if self._acks_while_paused > self.limits.max_outbound_acks:
                raise _ConnectionError(ENHANCE_YOUR_CALM, "control frames not read (flood)")
        self._acks.append(data)

    def _on_rst_stream(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "RST_STREAM payload is not 4 bytes")
        if sid > self._last_sid:
            raise _ConnectionError(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        if not self._resets.take(self._clock.monotonic_s()):
            raise _ConnectionError(ENHANCE_YOUR_CALM, "stream reset rate exceeded")
        stream = self.streams.get(sid)
        if stream is not None:
            self._remove(stream)
            self.app.on_reset(self, stream)

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS payload not a multiple of 6")
        if len(payload) // 6 > self.limits.max_settings_entries:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "SETTINGS: too many setting entries")
        if not self._settings.take(self._clock.monotonic_s()):
            raise _ConnectionError(ENHANCE_YOUR_CALM, "too many SETTINGS frames")
        for pos in range(0, len(payload), 6):
            ident, value = _SETTING.unpack_from(payload, pos)
            if ident == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                delta = value - self._peer_stream_window
                self._peer_stream_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif ident == S_MAX_FRAME_SIZE:
                if not MAX_FRAME_SIZE <= value < 1 << 24:
                    raise _ConnectionError(PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self._peer_max_frame = value
            elif ident == S_ENABLE_PUSH and value > 1:
                raise _ConnectionError(PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1")
        self._write_ack(frame(SETTINGS, ACK, 0))
        self._flush_blocked()

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE payload is not 4 bytes")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "connection window above 2^31-1")
            self._flush_blocked()
            return
        if sid > self._last_sid:
            raise _ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
        stream = self.streams.get(sid)
        if stream is None:
            return
        if increment == 0 or stream.send_window + increment > MAX_WINDOW:
            code = PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR
            self.reset(stream, code)
            self.app.on_reset(self, stream)
            return
        stream.send_window += increment
        if stream.out_len or stream.trailers is not None:
            self._flush(stream)

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0 or not sid & 1:
            raise _ConnectionError(PROTOCOL_ERROR, f"HEADERS on stream {sid}")
        if flags & PADDED:
            payload = _unpad(payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise _ConnectionError(FRAME_SIZE_ERROR, "HEADERS too short for PRIORITY")
            payload = payload[5:]
        if flags & END_HEADERS:
            self._on_header_block(sid, payload, bool(flags & END_STREAM))
            return
        self._cont_sid = sid
        self._cont_block = bytearray(payload)
        self._cont_end = bool(flags & END_STREAM)
        self._cont_count = 0
        self._check_block_size()

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0 or sid != self._cont_sid:
            raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._cont_count += 1
        if self._cont_count > self.limits.max_continuations:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        self._cont_block += payload
        self._check_block_size()
        if flags & END_HEADERS:
            self._cont_sid = 0
            block, self._cont_block = bytes(self._cont_block), bytearray()
            self._on_header_block(sid, block, self._cont_end)

    def _check_block_size(self) -> None:
        if len(self._cont_block) > self.limits.max_header_block:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "header block too large")

    def _decode(self, block: bytes) -> list[Header]:
        """HPACK-decode ``block``.  A client repeating a request (a re-poll) sends the same
        block, whose meaning then depends only on the dynamic table: such blocks are decoded
        once (pure-Python HPACK costs ~40-120 µs a block) until a block that may change the
        table arrives."""
        cache = self._block_cache
        headers = cache.get(block)
        if headers is not None:
            return headers
        try:  # always decoded: the HPACK table must stay in step even for refused streams
            headers = self._decoder.decode(block, raw=True)  # type: ignore[assignment]
        except hpack.HPACKError as err:
            raise _ConnectionError(COMPRESSION_ERROR, f"HPACK: {err}") from None
        assert headers is not None
        if _keeps_table(block):
            if len(cache) >= _BLOCK_CACHE_MAX:
                cache.clear()
            cache[block] = headers
        elif cache:
            cache.clear()
        return headers

    def _on_header_block(self, sid: int, block: bytes, end_stream: bool) -> None:
        headers = self._decode(block)
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from a client: gRPC ends the request with them
            if not end_stream:
                raise _ConnectionError(PROTOCOL_ERROR, "second HEADERS without END_STREAM")
            if not stream.remote_closed:
                stream.remote_closed = True
                self.app.on_end(self, stream)
            return
        if sid <= self._last_sid:
            raise _ConnectionError(STREAM_CLOSED, f"HEADERS on closed stream {sid}")
        self._last_sid = sid
        if self.going_away or self._peer_goaway:
            self._write(frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
            return
        if len(self.streams) >= self.limits.max_concurrent_streams:
            self._write(frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
            return
        stream = Stream(sid, headers, self._peer_stream_window, self.limits.stream_window)
        stream.remote_closed = end_stream
        self.streams[sid] = stream
        self.app.on_request(self, stream)
        if end_stream and self.streams.get(sid) is stream:
            self.app.on_end(self, stream)

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise _ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        data = _unpad(payload) if flags & PADDED else payload
        if not size and not flags & END_STREAM:
            self._glitch("empty DATA")
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            if sid > self._last_sid:
                raise _ConnectionError(PROTOCOL_ERROR, "DATA on an idle stream")
            if stream is not None:
                self._glitch("DATA after END_STREAM")
                self.reset(stream, STREAM_CLOSED)
                self.app.on_reset(self, stream)
            self._maybe_credit()
            return
        stream.recv_window -= size
        if stream.recv_window < 0:
            self.reset(stream, FLOW_CONTROL_ERROR)
            self.app.on_reset(self, stream)
            self._maybe_credit()
            return
        if data:
            if not stream.buffered:
                self._buffering_streams += 1
            stream.buffered += len(data)
            self._buffered += len(data)
            self._budget.used += len(data)
            self.app.on_data(self, stream, data)
        if flags & END_STREAM:
            if sid in self.streams:
                stream.remote_closed = True
                self.app.on_end(self, stream)
        elif stream.recv_window < self.limits.stream_window // 2 and sid in self.streams:
            increment = self.limits.stream_window - stream.recv_window
            stream.recv_window += increment
            self._write(frame(WINDOW_UPDATE, 0, sid, _U32.pack(increment)))
        self._maybe_credit()

    # ------------------------------------------------------------- input accounting

    def release(self, stream: Stream, size: int) -> None:
        """The app no longer holds ``size`` bytes of ``stream``'s DATA."""
        size = min(size, stream.buffered)
        if size <= 0:
            return
        stream.buffered -= size
        self._buffered -= size
        budget = self._budget
        budget.give(size)
        if not stream.buffered:
            self._buffering_streams -= 1
            if not self._buffered and (budget.input_pass is self or budget.waiting):
                budget.forget_input(self)
        self._maybe_credit()

    def retry_credit(self) -> None:
        self._maybe_credit()

    def _maybe_credit(self) -> None:
        """Re-open the connection window once half of it is used, if the connection and the
        server-wide budget allow (else it stays shut and the peer waits)."""
        window = self._recv_window
        target = self.limits.connection_window
        if self.closed or window > target // 2:
            return
        streams = self._buffering_streams
        if (self._buffered <= self.limits.max_buffered_input or streams <= 1) and (
            self._budget.admit_input(self, single_stream=streams == 1)
        ):
            grant = target - window
        else:
            held = window + self._buffered
            if held >= INPUT_FLOOR // 2:
                return  # held back: retried when the app releases or the budget has room
            grant = INPUT_FLOOR - held
        self._recv_window = window + grant
        self._write(frame(WINDOW_UPDATE, 0, 0, _U32.pack(grant)))

    @property
    def buffered_input(self) -> int:
        return self._buffered

    @property
    def queued_output(self) -> int:
        return self._queued_out

    # ------------------------------------------------------------- frames out

    def send_reply(
        self,
        stream: Stream,
        headers: bytes,
        message: bytes,
        trailers: bytes,
        *,
        counted: bool = True,
    ) -> None:
        """A whole unary answer: response HEADERS, one gRPC ``message`` (already framed with
        its 5-byte prefix), trailers.  One write when the peer's windows allow; else in
        pieces.  ``counted=False``: ``message`` is shared by many streams (a pubsub
        publish) and bounded by its owner, so it is not counted in the server-wide budget."""
        size = len(message)
        self._sent_since_ping = True
        if (
            size <= self._send_window
            and size <= stream.send_window
            and size <= self._peer_max_frame
            and size <= _FAST_REPLY_MAX
            and len(headers) <= self._peer_max_frame
            and len(trailers) <= self._peer_max_frame
            and not stream.out_len
            and self.streams.get(stream.id) is stream
        ):
            self._send_window -= size
            stream.send_window -= size
            sid = stream.id
            self._write(
                b"".join(
                    (
                        frame_header(len(headers), HEADERS, END_HEADERS, sid),
                        headers,
                        frame_header(size, DATA, 0, sid),
                        message,
                        frame_header(len(trailers), HEADERS, END_HEADERS | END_STREAM, sid),
                        trailers,
                    )
                )
            )
            self._local_closed(stream)
            return
        self.send_headers(stream, headers)
        self.send_data(stream, message, counted=counted)
        self.send_trailers(stream, trailers)

    def send_headers(self, stream: Stream, block: bytes, *, end_stream: bool = False) -> None:
        """Response headers (or, with ``end_stream``, a trailers-only response)."""
        if self.streams.get(stream.id) is not stream:
            return
        self._sent_since_ping = True
        self._write(self._header_frames(stream.id, block, end_stream))
        if end_stream:
            self._local_closed(stream)

    def can_queue(self, size: int) -> bool:
        """Whether a reply of ``size`` bytes may wait here for the peer to read it without
        going past the server-wide budget (or taking the one pass past it)."""
        budget = self._budget
        return (
            size <= OUTPUT_FLOOR
            or budget.room(size)
            or budget.output_pass is None
            or budget.output_pass is self
        )

    def send_data(self, stream: Stream, data: bytes, *, counted: bool = True) -> None:
        """``data`` goes out as the windows and the socket allow; the rest waits, held as
        given (no copy)."""
        if self.streams.get(stream.id) is not stream or not data:
            return
        self._sent_since_ping = True
        view = memoryview(data)
        end = len(data)
        pos = 0
        if not stream.out_len and not self._paused:
            pos = self._write_data(stream, view)
        if pos < end:
            rest = end - pos
            if stream.out is None:
                stream.out = deque()
            stream.out.append(view[pos:])
            stream.out_len += rest
            self._queued_out += rest
            if counted:
                stream.counted += rest
                self._counted_out += rest
                self._budget.take(rest)
            self._blocked[stream.id] = stream
            self._check_output_bound()

    def _write_data(self, stream: Stream, view: memoryview) -> int:
        """DATA frames of ``view`` as far as the windows allow, in socket-sized writes while
        the socket drains; returns how much was written."""
        pos, end, sid = 0, len(view), stream.id
        max_frame = self._peer_max_frame
        while pos < end and not self._paused and not self.closed:
            chunks: list[bytes | memoryview] = []
            batch = 0
            while pos < end and batch < _WRITE_BATCH:
                # The batch bounds one write whatever frame size the peer allows (C-core
                # allows 16 MiB frames: one frame could carry a whole window past the socket's
                # high-water mark and the output bound at once).
                size = min(
                    end - pos,
                    self._send_window,
                    stream.send_window,
                    max_frame,
                    _WRITE_BATCH - batch,
                )
                if size <= 0:
                    break
                chunks.append(frame_header(size, DATA, 0, sid))
                chunks.append(view[pos : pos + size])
                pos += size
                batch += size
                self._send_window -= size
                stream.send_window -= size
            if not chunks:
                break
            self._sent_since_ping = True  # C-core forgives ping strikes on every DATA sent
            self._write(b"".join(chunks))
        return pos

    def send_trailers(self, stream: Stream, block: bytes) -> None:
        """Ends the stream after the data queued before it."""
        if self.streams.get(stream.id) is not stream:
            return
        stream.trailers = block
        self._flush(stream)

    def reset(self, stream: Stream, code: int) -> None:
        """RST_STREAM from our side; the app is not called back."""
        if self.streams.get(stream.id) is stream:
            self._remove(stream)
            self._write(frame(RST_STREAM, 0, stream.id, _U32.pack(code)))

    def _header_frames(self, sid: int, block: bytes, end_stream: bool) -> bytes:
        max_frame = self._peer_max_frame
        end = END_STREAM if end_stream else 0
        if len(block) <= max_frame:
            return frame_header(len(block), HEADERS, END_HEADERS | end, sid) + block
        parts = [block[i : i + max_frame] for i in range(0, len(block), max_frame)]
        out = [frame(HEADERS, end, sid, parts[0])]
        for i, part in enumerate(parts[1:], start=2):
            out.append(frame(CONTINUATION, END_HEADERS if i == len(parts) else 0, sid, part))
        return b"".join(out)

    def _flush(self, stream: Stream) -> None:
        """Queued data of ``stream`` as far as the windows and the socket allow, then its
        trailers once nothing is left."""
        out = stream.out
        while out and not self._paused and not self.closed:
            head = out[0]
            written = self._write_data(stream, head)
            if written:
                self._dequeued(stream, written)
            if written < len(head):
                if written:
                    out[0] = head[written:]
                break
            out.popleft()
        if self.closed:
            return
        if not stream.out_len and stream.trailers is not None:
            block, stream.trailers = stream.trailers, None
            self._blocked.pop(stream.id, None)
            self._write(self._header_frames(stream.id, block, True))
            self._local_closed(stream)
            return
        if stream.out_len:
            self._blocked[stream.id] = stream
        else:
            self._blocked.pop(stream.id, None)

    def _dequeued(self, stream: Stream, size: int) -> None:
        stream.out_len -= size
        self._queued_out -= size
        counted = min(size, stream.counted)
        if counted:
            stream.counted -= counted
            self._counted_out -= counted
            self._budget.give(counted)
            if not self._counted_out:
                self._budget.forget_output(self)

    def _flush_blocked(self) -> None:
        for stream in list(self._blocked.values()):
            if self._send_window <= 0 or self._paused or self.closed:
                return
            self._flush(stream)

    def _local_closed(self, stream: Stream) -> None:
        """Our END_STREAM is sent.  A client still sending is told to stop (RST NO_ERROR,
        as gRPC servers do)."""
        if self.streams.get(stream.id) is not stream:
            return
        self._remove(stream)
        if not stream.remote_closed:
            self._write(frame(RST_STREAM, 0, stream.id, _U32.pack(NO_ERROR)))

    def _remove(self, stream: Stream) -> None:
        del self.streams[stream.id]
        if stream.buffered:
            self._buffered -= stream.buffered
            self._buffering_streams -= 1
            self._budget.give(stream.buffered)
            stream.buffered = 0
            if not self._buffered:
                self._budget.forget_input(self)
        if stream.out_len:
            self._dequeued(stream, stream.out_len)
            stream.out = None
        self._blocked.pop(stream.id, None)
        if not self.streams and (self.going_away or self._peer_goaway):
            self.close()
        else:
            self._maybe_credit()

    def _check_output_bound(self) -> None:
        transport = self.transport
        waiting = transport.get_write_buffer_size() if transport else 0
        if len(self._blocked) > 1:  # one stream's reply alone may be larger: it is being read
            waiting += self._queued_out
        if waiting > self.limits.max_buffered_output:
            self._warn("front.output_bound", bytes=waiting)
            self.abort(ENHANCE_YOUR_CALM, "peer does not read its replies")
            return
        budget = self._budget
        if budget.used <= budget.limit or self._counted_out <= OUTPUT_FLOOR:
            return
        if budget.output_pass is self:
            return
        if budget.output_pass is None and len(self._blocked) == 1:
            budget.output_pass = self  # one large reply being read
            return
        self._warn("front.output_budget", bytes=self._counted_out, budget=budget.limit)
        self.abort(ENHANCE_YOUR_CALM, "server output budget exhausted; read your replies")

    def cork(self) -> None:
        """Collect writes until :meth:`uncork`, which sends them in one ``write`` (a
        fan-out to many streams of one connection costs one syscall, not one per stream)."""
        if self._cork is None:
            self._cork = []

    def uncork(self) -> None:
        cork, self._cork = self._cork, None
        if cork:
            self._write(b"".join(cork))

    def _write(self, data: bytes) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        if self._acks:  # ACKs go before anything written after what they acknowledge
            acks, self._acks = self._acks, []
            data = b"".join((*acks, data))
        if self._cork is not None:
            self._cork.append(data)
            return
        transport.write(data)
        if self._paused:
            self._check_output_bound()

    def keepalive_tick(self, now: float, timeout_s: float) -> None:
        """Called periodically: PING a silent peer; drop it if the PING stays unanswered
        ``timeout_s`` (as grpc's server keepalive does: a held poll of a vanished client
        would otherwise keep its connection forever)."""
        if self.closed:
            return
        if self._ping_sent_at is not None:
            if now - self._ping_sent_at >= timeout_s:
                self.abort(NO_ERROR, "keepalive timeout")
            return
        if self._heard:
            self._heard = False
            return
        self._ping_sent_at = now
        self._write(frame(PING, 0, 0, _KEEPALIVE_PING))

    # ------------------------------------------------------------- connection end

    def goaway(self) -> None:
        """Graceful shutdown: no new streams; closed when the open ones finish."""
        if self.closed or self.going_away:
            return
        self.going_away = True
        self._write(frame(GOAWAY, 0, 0, struct.pack(">II", self._last_sid, NO_ERROR)))
        if not self.streams:
            self.close()

    def _warn(self, event: str, **fields: Any) -> None:
        if self._warnings is not None:
            self._warnings.warn(event, **fields)
        else:
            log.warning(event, **fields)

    def abort(self, code: int, reason: str) -> None:
        """Connection error: GOAWAY with ``code``, then close (open streams are reset)."""
        if self.closed:
            return
        if code != NO_ERROR:
            if self._warnings is not None:
                self._warnings.info("front.connection_error", code=code, reason=reason)
            else:
                log.info("front.connection_error", code=code, reason=reason)
        goaway = struct.pack(">II", self._last_sid, code) + reason.encode()[:200]
        transport = self.transport
        if transport is None:
            self._teardown()
            return
        transport.write(frame(GOAWAY, 0, 0, goaway))  # not _write: no bound check (recursion)
        if code == NO_ERROR or transport.is_closing():
            self.close()
            return
        # a peer still sending would get a TCP reset, and lose our GOAWAY with its unread
        # bytes, if we closed now: end our side, read and drop what it sends for a while
        self._teardown()
        try:
            transport.write_eof()
        except (NotImplementedError, RuntimeError, AttributeError):
            transport.close()
        loop = asyncio.get_running_loop()
        self._abort_timer = loop.call_later(_LINGER_S, self._abort_transport)

    def close(self) -> None:
        transport = self.transport
        self._teardown()
        if transport is not None and not transport.is_closing():
            transport.close()
            loop = asyncio.get_running_loop()
            self._abort_timer = loop.call_later(_ABORT_AFTER_S, self._abort_transport)

    def _abort_transport(self) -> None:
        """The socket did not flush in time: drop it (unless it closed meanwhile)."""
        self._abort_timer = None
        if self.transport is not None:
            self.transport.abort()

    def _teardown(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._buf = bytearray()  # what a flood left unparsed is dropped now, not at GC
        streams, self.streams = self.streams, {}
        self._blocked.clear()
        budget = self._budget
        budget.give(self._buffered + self._counted_out)
        self._recv_window = self._buffered = self._counted_out = self._queued_out = 0
        budget.forget_input(self)
        budget.forget_output(self)
        for stream in streams.values():
            stream.out = None
            try:
                self.app.on_reset(self, stream)
            except Exception:
                log.exception("front.reset_failed")
        if self._on_closed is not None:
            self._on_closed(self)


def _keeps_table(block: bytes) -> bool:
    """No field of ``block`` changes the HPACK dynamic table: only indexed fields and
    literals without indexing / never indexed (RFC 7541 6.1, 6.2.2, 6.2.3), so decoding it
    again under the same table gives the same headers.  (gRPC's C core sends custom
    metadata such as ``ray_cluster_id`` as literals without indexing on every call.)"""
    pos, end = 0, len(block)
    try:
        while pos < end:
            first = block[pos]
            if first & 0x80:  # indexed field
                pos = _skip_int(block, pos, 0x7F)
            elif first & 0xE0:  # incremental indexing (01) or a table size update (001)
                return False
            else:  # literal without indexing (0000) or never indexed (0001)
                new_name = not first & 0x0F
                pos = _skip_int(block, pos, 0x0F)
                if new_name:
                    pos = _skip_str(block, pos)
                pos = _skip_str(block, pos)
    except IndexError:
        return False
    return pos == end


def _skip_int(block: bytes, pos: int, mask: int) -> int:
    if block[pos] & mask != mask:
        return pos + 1
    pos += 1
    while block[pos] & 0x80:
        pos += 1
    return pos + 1


def _skip_str(block: bytes, pos: int) -> int:
    first = block[pos] & 0x7F
    if first != 0x7F:
        return pos + 1 + first
    length, shift = first, 0
    pos += 1
    while True:
        byte = block[pos]
        length += (byte & 0x7F) << shift
        shift += 7
        pos += 1
        if not byte & 0x80:
            return pos + length


def _unpad(payload: bytes) -> bytes:
    if not payload:
        raise _ConnectionError(FRAME_SIZE_ERROR, "PADDED frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise _ConnectionError(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]
