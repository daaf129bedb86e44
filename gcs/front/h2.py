"""The server side of HTTP/2 (RFC 9113) for the front server: frames, streams, flow control,
and the limits a server on a public port needs.

It knows nothing of gRPC.  One job a module: :mod:`.h2_base` (limits, streams, the
connection's fields), :mod:`.h2_input` (frames in, their limits, input credit),
:mod:`.h2_output` (frames out, windows, output bounds), this module (the connection's
lifecycle: start, keepalive, GOAWAY, abort, teardown).

A :class:`StreamApp` receives each stream's decoded request headers, its DATA payloads, its
end and its reset; it answers through
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
  server-wide :class:`~gcs.front.budget.ByteBudget` has room.  A peer sending beyond its
  window gets FLOW_CONTROL_ERROR.
* Output waiting on a peer that does not read is bounded by ``max_buffered_output`` per
  connection (one stream may hold more: one large reply being read) and by the server-wide
  budget; beyond either the connection is dropped (GOAWAY ENHANCE_YOUR_CALM).
* Floods end the connection with GOAWAY ENHANCE_YOUR_CALM, with nghttp2's and grpc C-core's
  limits (:mod:`gcs.front.ratelimit`): RST_STREAM beyond ``reset_burst`` + ``reset_rate``/s
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
from collections.abc import Callable
from typing import Any, Protocol, cast

import hpack
import structlog

from gcs.base.background import Background
from gcs.base.clock import Clock, SystemClock
from gcs.front.budget import ByteBudget
from gcs.front.deadlines import Deadline, Deadlines
from gcs.front.h2_base import INPUT_FLOOR, OUTPUT_FLOOR, U32, H2Limits, Header, Stream
from gcs.front.h2_input import SETTING, FrameInput
from gcs.front.h2_output import FrameOutput
from gcs.front.ratelimit import PingPolicy, TokenBucket
from gcs.rpc.h2_frames import (
    DEFAULT_WINDOW,
    GOAWAY,
    MAX_FRAME_SIZE,
    NO_ERROR,
    PING,
    PREFACE,
    S_ENABLE_PUSH,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_CONCURRENT_STREAMS,
    S_MAX_HEADER_LIST_SIZE,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)
from gcs.rpc.warnings import WarningSampler

__all__ = [
    "INPUT_FLOOR",
    "OUTPUT_FLOOR",
    "H2Limits",
    "H2ServerConnection",
    "Stream",
    "StreamApp",
]

log = structlog.get_logger("gcs.front")

_KEEPALIVE_PING = b"gcs-kalv"
_ABORT_AFTER_S = 5.0
"""A connection closed after an error is aborted if its last bytes cannot be flushed."""
_LINGER_S = 1.0
_LINGER_BYTES = 256 << 10
"""After a GOAWAY for an error, the peer's further bytes are read and dropped for at most
this long and this many bytes (a client stops at the GOAWAY; a flood does not)."""
_WRITE_HIGH_WATER = 512 << 10
"""The socket buffer above which we stop writing DATA (``pause_writing``)."""


class StreamApp(Protocol):
    def on_request(self, conn: H2ServerConnection, stream: Stream) -> None:
        """Request headers decoded; the stream may be answered right away."""

    def on_data(self, conn: H2ServerConnection, stream: Stream, data: bytes) -> None:
        """DATA payload (padding removed); counted as held until :meth:`release`."""

    def on_end(self, conn: H2ServerConnection, stream: Stream) -> None:
        """The client finished sending (END_STREAM)."""

    def on_reset(self, conn: H2ServerConnection, stream: Stream) -> None:
        """The stream ended without our trailers (client RST_STREAM, connection lost)."""


class H2ServerConnection(FrameInput, FrameOutput, asyncio.Protocol):
    """One client connection.  Slotted: at 2,000 subscriber connections a publish touches
    each once, and a dict of 40-odd attributes per connection cost ~0.6 µs per reply."""

    __slots__ = ()

    def __init__(
        self,
        app: StreamApp,
        limits: H2Limits,
        on_closed: Callable[[H2ServerConnection], None] | None = None,
        *,
        budget: ByteBudget | None = None,
        clock: Clock | None = None,
        warnings: WarningSampler | None = None,
        deadlines: Deadlines | None = None,
    ) -> None:
        """``deadlines``: the server's timers (the abort of a socket that does not flush
        after a close); by default the connection's own, on ``clock``."""
        self.app = app
        self.limits = limits
        self._on_closed = on_closed
        self._budget = budget if budget is not None else ByteBudget(1 << 62)
        self._clock = clock if clock is not None else SystemClock()
        self._deadlines = (
            deadlines if deadlines is not None else Deadlines(self._clock, Background("h2"))
        )
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
        self._abort_timer: Deadline | None = None
        self._parse_deferred = False
        self._lingered = 0

    # ------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's are not asyncio.Transport subclasses)
        self.transport = transport = cast(asyncio.Transport, transport)
        with contextlib.suppress(NotImplementedError):  # a test transport
            transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        lim = self.limits
        settings = b"".join(
            SETTING.pack(ident, value)
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
            out += frame(WINDOW_UPDATE, 0, 0, U32.pack(lim.connection_window - DEFAULT_WINDOW))
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

    @property
    def last_stream_id(self) -> int:
        """The last stream the peer opened (GOAWAY's last-stream-id by default)."""
        return self._last_sid

    def goaway(self, last_sid: int | None = None) -> None:
        """Graceful shutdown: no new streams; closed when the open ones finish.
        ``last_sid``: the last stream processed (default: the last one received); a gRPC
        client retries the streams after it on a new connection, transparently."""
        if self.closed or self.going_away:
            return
        self.going_away = True
        last = self._last_sid if last_sid is None else last_sid
        self._write(frame(GOAWAY, 0, 0, struct.pack(">II", last, NO_ERROR)))
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
        self._abort_timer = self._deadlines.add(_LINGER_S, self._abort_transport)

    def close(self) -> None:
        transport = self.transport
        self._teardown()
        if transport is not None and not transport.is_closing():
            transport.close()
            self._abort_timer = self._deadlines.add(_ABORT_AFTER_S, self._abort_transport)

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
