"""A lean HTTP/2 (h2c, prior knowledge) client for hot gRPC unary calls.

grpc.aio spends ~300-550 µs of CPU per unary call in its own per-call machinery; the load
poller makes one call per raylet per second, so at 2,000 raylets that alone is a core.  This
client speaks just enough HTTP/2 for a unary gRPC call on one persistent connection per peer:

* preface + SETTINGS (ENABLE_PUSH=0, HEADER_TABLE_SIZE=0, stream windows at the maximum) and
  one large connection WINDOW_UPDATE, topped up as DATA arrives;
* request HEADERS pre-encoded once per connection and path (static-table references and literals
  without indexing), then one DATA frame with the 5-byte gRPC prefix and END_STREAM;
* response headers/trailers decoded with ``hpack``; as we advertise a 0-byte dynamic table a
  server's header blocks are stateless, so identical blocks are decoded once and cached;
* SETTINGS/PING acked; GOAWAY, RST_STREAM and connection loss fail the affected calls with
  ``UNAVAILABLE``; the next call reconnects lazily;
* per-call deadline (``grpc-timeout`` sent to the server and enforced locally, the stream is
  reset on expiry); replies larger than ``max_message_bytes`` are refused (bounded memory).

Errors are ``H2CallError`` carrying a ``grpc.StatusCode``, like ``AioRpcError.code()``.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field
from typing import cast

import grpc
import hpack

from gcs.base.background import Background
from gcs.base.clock import SYSTEM_CLOCK, Clock, Timer
from gcs.rpc.h2_frames import (
    ACK,
    CANCEL,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    MAX_FRAME_SIZE,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_HEADER_TABLE_SIZE,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    WINDOW_UPDATE,
)
from gcs.rpc.h2_frames import frame as _frame
from gcs.rpc.h2_frames import frame_header as _frame_header
from gcs.rpc.h2_frames import literal_new as _literal_new
from gcs.rpc.raylet_io.h2_grpc import (
    H2CallError,
    encode_request_headers,
    grpc_timeout_value,
    http_status_error,
    trailers_result,
)

_CONN_TOPUP_AT = 2**30
_DECODE_CACHE_MAX = 64
_PING_ACK_DELAY_S = 2.0
"""grpc servers send a BDP ping after ~30% of replies; acking it with the next request instead
of its own write saves a send syscall (~40 µs).  2 s is far inside keepalive timeouts (Ray
raylets: 20 s) and only slows the server's BDP estimate, which unary polls do not need."""


@dataclass(slots=True)
class _Stream:
    future: asyncio.Future[bytes]
    headers_seen: bool = False
    body: bytearray = field(default_factory=bytearray)
    header_block: bytearray | None = None
    header_end_stream: bool = False


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection carrying unary gRPC calls to a single path."""

    def __init__(
        self,
        path: str,
        authority: str,
        max_message_bytes: int,
        authorization: str = "",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._path = path
        self._clock = clock
        self._authority = authority
        self._max_message = max_message_bytes
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        self._authorization = authorization
        self._headers_base = encode_request_headers(path, authority, authorization)
        self._timeout_blocks: dict[str | tuple[str, str], bytes] = {}
        """Request header blocks by grpc-timeout (default path) or (path, grpc-timeout)."""
        self._decoder = hpack.Decoder()
        # We advertise HEADER_TABLE_SIZE=0, but a server may still use the RFC default of 4096
        # before it applies our SETTINGS, and not every encoder sends the size update
        # afterwards: decode statefully and only cache blocks decoded with an empty table.
        self._decoder.max_allowed_table_size = 4096
        self._decode_cache: dict[bytes, list[tuple[str, str]]] = {}
        self._conn_recv_consumed = 0
        self._send_window = DEFAULT_WINDOW
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_frame = 16384
        self._window_waiters: list[asyncio.Future[None]] = []
        self._continuation_stream = 0
        self._control: list[bytes] = []
        self._control_timer: Timer | None = None
        self._loop = asyncio.get_running_loop()
        self._orphan_block: bytearray | None = None
        self._orphan_end = False
        self.closed = False
        self.going_away = False
        self.close_reason = ""

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's are not asyncio.Transport subclasses)
        self._transport = transport = cast(asyncio.Transport, transport)
        settings = struct.pack(
            ">HIHIHI",
            S_HEADER_TABLE_SIZE,
            0,
            S_ENABLE_PUSH,
            0,
            S_INITIAL_WINDOW_SIZE,
            MAX_WINDOW,
        )
        transport.write(
            PREFACE
            + _frame(SETTINGS, 0, 0, settings)
            + _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(self.close_reason or f"connection lost: {exc or 'closed by peer'}")

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        n = len(buf)
        try:
            while n - pos >= 9:
                length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
                if length > MAX_FRAME_SIZE:
                    raise _ProtocolError(f"{length}-byte frame above SETTINGS_MAX_FRAME_SIZE")
                if n - pos < 9 + length:
                    break
                ftype = buf[pos + 3]
                flags = buf[pos + 4]
                stream_id = int.from_bytes(buf[pos + 5 : pos + 9]) & 0x7FFFFFFF
                payload = bytes(buf[pos + 9 : pos + 9 + length])
                pos += 9 + length
                self._on_frame(ftype, flags, stream_id, payload)
                if self.closed:
                    return
        except _ProtocolError as err:
            self._abort(PROTOCOL_ERROR, str(err))
            return
        del buf[:pos]

    # ---------------------------------------------------------------- frames

    def _on_frame(self, ftype: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation_stream and ftype != CONTINUATION:
            raise _ProtocolError("expected CONTINUATION")
        if ftype == DATA:
            self._on_data(flags, stream_id, payload)
        elif ftype == HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif ftype == CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif ftype == SETTINGS:
            if not flags & ACK:
                self._on_settings(payload)
                self._write(_frame(SETTINGS, ACK, 0))

        elif ftype == PING:
            if not flags & ACK:
                self._control.append(_frame(PING, ACK, 0, payload))
                if self._control_timer is None:
                    self._control_timer = self._clock.call_later(
                        _PING_ACK_DELAY_S, self._flush_control
                    )
        elif ftype == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4]) & 0x7FFFFFFF
            if stream_id == 0:
                self._send_window += increment
                self._wake_window_waiters()
        elif ftype == RST_STREAM:
            code = int.from_bytes(payload[:4])
            status = grpc.StatusCode.CANCELLED if code == CANCEL else grpc.StatusCode.UNAVAILABLE
            self._finish(stream_id, H2CallError(status, f"stream reset by peer (h2 error {code})"))
        elif ftype == GOAWAY:
            last_id = int.from_bytes(payload[:4]) & 0x7FFFFFFF
            code = int.from_bytes(payload[4:8])
            self.going_away = True
            self.close_reason = f"GOAWAY (h2 error {code}): {payload[8:].decode(errors='replace')}"
            for sid in [s for s in self._streams if s > last_id]:
                self._finish(sid, H2CallError(grpc.StatusCode.UNAVAILABLE, self.close_reason))
            if not self._streams:
                self.close()
        elif ftype == PUSH_PROMISE:
            raise _ProtocolError("PUSH_PROMISE with push disabled")
        # PRIORITY and unknown frame types are ignored, as RFC 9113 requires.

    def _on_settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            ident, value = struct.unpack_from(">HI", payload, i)
            if ident == S_INITIAL_WINDOW_SIZE:
                self._peer_initial_window = value
            elif ident == S_MAX_FRAME_SIZE:
                self._peer_max_frame = value

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._conn_recv_consumed += len(payload)
        if self._conn_recv_consumed >= _CONN_TOPUP_AT:
            self._write(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._conn_recv_consumed)))
            self._conn_recv_consumed = 0
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # cancelled or finished: the bytes only count for flow control
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        if not stream.headers_seen:
            raise _ProtocolError("DATA before HEADERS")
        stream.body += payload
        # The stream window starts at 2**31-1; refill it only for replies that could exhaust it.
        if len(stream.body) > self._max_message + 5:
            self._write(_frame(RST_STREAM, 0, stream_id, struct.pack(">I", CANCEL)))
            self._finish(
                stream_id,
                H2CallError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"reply larger than {self._max_message} bytes",
                ),
            )
            return
        if flags & END_STREAM:
            self._finish(stream_id, H2CallError(grpc.StatusCode.INTERNAL, "no trailers"))

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if flags & PADDED:
            pad = payload[0]
            payload = payload[1 : len(payload) - pad]
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        if flags & END_HEADERS:
            self._on_header_block(stream_id, payload, bool(flags & END_STREAM))
            return
        stream = self._streams.get(stream_id)
        self._continuation_stream = stream_id
        if stream is not None:
            stream.header_block = bytearray(payload)
            stream.header_end_stream = bool(flags & END_STREAM)
        else:  # still must be decoded to keep HPACK state in step
            self._orphan_block = bytearray(payload)
            self._orphan_end = bool(flags & END_STREAM)

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != self._continuation_stream:
            raise _ProtocolError("CONTINUATION on the wrong stream")
        stream = self._streams.get(stream_id)
        block = stream.header_block if stream is not None else self._orphan_block
        assert block is not None
        block += payload
        if len(block) > 1 << 20:
            raise _ProtocolError("header block too large")
        if flags & END_HEADERS:
            self._continuation_stream = 0
            end = stream.header_end_stream if stream is not None else self._orphan_end
            if stream is not None:
                stream.header_block = None
            self._on_header_block(stream_id, bytes(block), end)

    def _decode(self, block: bytes) -> list[tuple[str, str]]:
        table = self._decoder.header_table
        stateless = not table.dynamic_entries
        if stateless:
            cached = self._decode_cache.get(block)
            if cached is not None:
                return cached
        try:
            headers: list[tuple[str, str]] = list(self._decoder.decode(block))  # type: ignore[arg-type]
        except hpack.HPACKError as err:
            raise _ProtocolError(f"HPACK: {err}") from None
        if stateless and not table.dynamic_entries:
            if len(self._decode_cache) >= _DECODE_CACHE_MAX:
                self._decode_cache.clear()
            self._decode_cache[block] = headers
        return headers

    def _on_header_block(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        headers = self._decode(block)
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if not stream.headers_seen and not end_stream:
            stream.headers_seen = True
            status = next((v for k, v in headers if k == ":status"), "")
            if status != "200":
                self._reset(stream_id, http_status_error(status))
            return
        # trailers, or a trailers-only response
        self._finish(stream_id, trailers_result(headers, stream.body))

    # ---------------------------------------------------------------- calls

    async def call(self, message: bytes, timeout_s: float | None, path: str | None = None) -> bytes:
        """One unary call (to ``path``, default the connection's); the caller enforces the
        deadline around this coroutine (None: no deadline, none sent)."""
        if self.closed or self.going_away:
            raise H2CallError(grpc.StatusCode.UNAVAILABLE, self.close_reason or "closed")
        if self._next_id > MAX_WINDOW:
            self.going_away = True
            raise H2CallError(grpc.StatusCode.UNAVAILABLE, "stream ids exhausted")
        body = b"\x00" + len(message).to_bytes(4) + message
        while len(body) > self._send_window:
            waiter = self._loop.create_future()
            self._window_waiters.append(waiter)
            await waiter
            if self.closed:
                raise H2CallError(grpc.StatusCode.UNAVAILABLE, self.close_reason or "closed")
        if len(body) > self._peer_initial_window:
            raise H2CallError(grpc.StatusCode.INTERNAL, "request exceeds the stream window")
        stream_id = self._next_id
        self._next_id += 2
        timeout = "" if timeout_s is None else grpc_timeout_value(timeout_s)
        key = timeout if path is None else (path, timeout)
        block = self._timeout_blocks.get(key)
        if block is None:
            if len(self._timeout_blocks) > 32:
                self._timeout_blocks.clear()
            base = (
                self._headers_base
                if path is None
                else encode_request_headers(path, self._authority, self._authorization)
            )
            deadline = _literal_new("grpc-timeout", timeout) if timeout else b""
            block = self._timeout_blocks[key] = base + deadline
        future: asyncio.Future[bytes] = self._loop.create_future()
        self._streams[stream_id] = _Stream(future)
        self._send_window -= len(body)
        out = [_frame_header(len(block), HEADERS, END_HEADERS, stream_id), block]
        if self._control:
            out[:0] = self._control
            self._control = []
            if self._control_timer is not None:
                self._control_timer.cancel()
                self._control_timer = None
        max_frame = self._peer_max_frame
        for start in range(0, len(body), max_frame):
            chunk = body[start : start + max_frame]
            last = start + max_frame >= len(body)
            out.append(_frame_header(len(chunk), DATA, END_STREAM if last else 0, stream_id))
            out.append(chunk)
        self._write(b"".join(out))
        try:
            return await future
        except asyncio.CancelledError:
            if self._streams.pop(stream_id, None) is not None and not self.closed:
                self._write(_frame(RST_STREAM, 0, stream_id, struct.pack(">I", CANCEL)))
            raise

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._flush_control()
            self._transport.close()
        self._fail_all(self.close_reason or "closed")

    # ---------------------------------------------------------------- internals

    def _flush_control(self) -> None:
        self._control_timer = None
        control, self._control = self._control, []
        if control:
            self._write(b"".join(control))

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self.closed:
            self._transport.write(data)

    def _reset(self, stream_id: int, error: H2CallError) -> None:
        self._write(_frame(RST_STREAM, 0, stream_id, struct.pack(">I", CANCEL)))
        self._finish(stream_id, error)

    def _finish(self, stream_id: int, result: bytes | H2CallError) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None and not stream.future.done():
            if isinstance(result, H2CallError):
                stream.future.set_exception(result)
            else:
                stream.future.set_result(result)
        if self.going_away and not self._streams and not self.closed:
            self.close()

    def _abort(self, code: int, reason: str) -> None:
        self.close_reason = f"protocol error: {reason}"
        goaway = struct.pack(">II", max(0, self._next_id - 2), code) + reason.encode()[:200]
        self._write(_frame(GOAWAY, 0, 0, goaway))
        self.close()

    def _fail_all(self, reason: str) -> None:
        self.closed = True
        if self._control_timer is not None:
            self._control_timer.cancel()
            self._control_timer = None
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            if not stream.future.done():
                stream.future.set_exception(H2CallError(grpc.StatusCode.UNAVAILABLE, reason))
        self._wake_window_waiters()

    def _wake_window_waiters(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class _ProtocolError(Exception):
    pass


class H2UnaryClient:
    """Unary calls to one ``host:port`` and path over a lazily (re)connected connection."""

    def __init__(
        self,
        address: str,
        path: str,
        *,
        max_message_bytes: int = 64 << 20,
        authorization: str = "",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``clock``: a call's deadline and the connection's timers run on it."""
        self.address = address
        self._clock = clock
        self._tasks = Background("h2")
        self._authorization = authorization
        host, _, port = address.rpartition(":")
        self._host = host.strip("[]")
        self._port = int(port)
        self._path = path
        self._max_message = max_message_bytes
        self._conn: H2Connection | None = None
        self._connecting: asyncio.Task[H2Connection | H2CallError] | None = None

    async def call(self, message: bytes, timeout_s: float | None, path: str | None = None) -> bytes:
        """Send ``message`` (to ``path``, default the client's); return the reply's bytes or
        raise ``H2CallError``.  ``timeout_s`` None: no deadline (a worker lease the raylet
        queues until it grants it)."""
        if timeout_s is None:
            conn = await self._connection()
            return await conn.call(message, None, path)
        try:
            async with self._clock.timeout(timeout_s):
                conn = await self._connection()
                return await conn.call(message, timeout_s, path)
        except TimeoutError:
            raise H2CallError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded") from None

    async def _connection(self) -> H2Connection:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.going_away:
            return conn
        if self._connecting is None:
            # shared by the calls waiting for it; outlives one that times out
            self._connecting = self._tasks.start(self._connect_or_error(), "connect")
        connecting = self._connecting
        try:
            result = await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None
        if isinstance(result, H2CallError):
            raise H2CallError(result.code(), result.details)  # each waiter its own
        return result

    async def _connect_or_error(self) -> H2Connection | H2CallError:
        """A refused connect is an answer for its waiters, not a background failure."""
        try:
            return await self._connect()
        except H2CallError as err:
            return err

    async def _connect(self) -> H2Connection:
        loop = asyncio.get_running_loop()
        authority = f"{self._host}:{self._port}"
        try:
            _, protocol = await loop.create_connection(
                lambda: H2Connection(
                    self._path, authority, self._max_message, self._authorization, self._clock
                ),
                self._host,
                self._port,
            )
        except OSError as err:
            raise H2CallError(grpc.StatusCode.UNAVAILABLE, f"connect {authority}: {err}") from None
        self._conn = protocol
        return protocol

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close_reason = "client closed"
            self._conn.close()
            self._conn = None
