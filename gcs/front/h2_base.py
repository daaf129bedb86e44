"""What every part of the front server's HTTP/2 connection shares: the limits
(:class:`H2Limits`), a request :class:`Stream`, the :class:`StreamApp` contract, the
connection error, and :class:`ConnectionState`, the fields of one connection that the frame
reader (:mod:`.h2_input`), the writer (:mod:`.h2_output`) and the connection's lifecycle
(:mod:`.h2`) work on together.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import hpack

from gcs.base.clock import Clock
from gcs.front.budget import ByteBudget
from gcs.front.deadlines import Deadline, Deadlines
from gcs.front.ratelimit import PingPolicy, TokenBucket
from gcs.rpc.h2_frames import DEFAULT_WINDOW
from gcs.rpc.warnings import WarningSampler

Header = tuple[bytes, bytes]
U32 = struct.Struct(">I")
INPUT_FLOOR = DEFAULT_WINDOW
"""Connection credit a connection holding (almost) nothing always gets, whatever the
server-wide budget: small requests keep flowing while others' large ones wait."""
OUTPUT_FLOOR = 1 << 20
"""Reply bytes a connection may have waiting whatever the server-wide budget."""


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


class ConnectionFault(Exception):
    """A connection error (RFC 9113 5.4.1): GOAWAY with ``code``, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConnectionState:
    """The fields of one connection (set by :class:`~gcs.front.h2.H2ServerConnection`,
    which holds them in slots), and the methods each part calls on another."""

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
        "_deadlines",
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

    app: Any
    """The :class:`StreamApp` (typed where it is given: its methods take the whole
    connection, which each part here only is a base of)."""
    limits: H2Limits
    transport: asyncio.Transport | None
    closed: bool
    going_away: bool
    streams: dict[int, Stream]
    _on_closed: Callable[[Any], None] | None
    _budget: ByteBudget
    _clock: Clock
    _warnings: WarningSampler | None
    _buf: bytearray
    _preface_left: int
    _decoder: hpack.Decoder
    _last_sid: int
    _cont_sid: int
    _cont_block: bytearray
    _cont_end: bool
    _cont_count: int
    _recv_window: int
    _buffered: int
    _buffering_streams: int
    _send_window: int
    _peer_stream_window: int
    _peer_max_frame: int
    _blocked: dict[int, Stream]
    _queued_out: int
    _counted_out: int
    _paused: bool
    _acks_while_paused: int
    _acks: list[bytes]
    _cork: list[bytes] | None
    _peer_goaway: bool
    _heard: bool
    _ping_sent_at: float | None
    _block_cache: dict[bytes, list[Header]]
    _resets: TokenBucket
    _glitches: TokenBucket
    _settings: TokenBucket
    _pings: PingPolicy
    _sent_since_ping: bool
    _abort_timer: Deadline | None
    _deadlines: Deadlines
    _parse_deferred: bool
    _lingered: int

    if TYPE_CHECKING:  # defined by the parts (h2_input, h2_output, h2)

        def _write(self, data: bytes) -> None: ...
        def _flush(self, stream: Stream) -> None: ...
        def _flush_blocked(self) -> None: ...
        def _remove(self, stream: Stream) -> None: ...
        def _maybe_credit(self) -> None: ...
        def _warn(self, event: str, **fields: Any) -> None: ...
        def reset(self, stream: Stream, code: int) -> None: ...
        def abort(self, code: int, reason: str) -> None: ...
        def close(self) -> None: ...
