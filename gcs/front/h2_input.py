"""Reading a connection: frames parsed from the socket's bytes, checked against the limits
(RFC 9113's rules, nghttp2's and grpc C-core's flood limits), handed to the
:class:`~gcs.front.h2.StreamApp`; and the input accounting that grants the peer
connection credit only while the connection and the server-wide budget have room.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct

import hpack
import structlog

from gcs.front.h2_base import INPUT_FLOOR, U32, ConnectionFault, ConnectionState, Header, Stream
from gcs.rpc.h2_frames import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
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
    S_MAX_FRAME_SIZE,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    frame,
)

log = structlog.get_logger("gcs.front")

SETTING = struct.Struct(">HI")
_BLOCK_CACHE_MAX = 32
_FRAMES_PER_TURN = 512
"""Frames parsed per connection per event-loop turn (then reading pauses for a turn)."""


class FrameInput(ConnectionState):
    """The reading half of :class:`~gcs.front.h2.H2ServerConnection`."""

    __slots__ = ()

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
                    raise ConnectionFault(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
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
                    raise ConnectionFault(FRAME_SIZE_ERROR, f"{length}-byte frame")
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
        except ConnectionFault as err:
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
            raise ConnectionFault(ENHANCE_YOUR_CALM, f"too many suspicious frames ({what})")

    def _on_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if self._cont_sid and ftype != CONTINUATION:
            raise ConnectionFault(PROTOCOL_ERROR, "expected CONTINUATION")
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
                raise ConnectionFault(PROTOCOL_ERROR, "GOAWAY on a stream")
            self._peer_goaway = True
            if not self.streams:
                self.close()
        elif ftype == PRIORITY:
            if sid == 0:
                raise ConnectionFault(PROTOCOL_ERROR, "PRIORITY on stream 0")
            self._glitch("PRIORITY")
        elif ftype == PUSH_PROMISE:
            raise ConnectionFault(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        else:  # unknown frame types are ignored (RFC 9113 section 4.1)
            self._glitch("unknown frame type")

    def _on_ping(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ConnectionFault(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ConnectionFault(FRAME_SIZE_ERROR, "PING payload is not 8 bytes")
        if flags & ACK:
            return
        if self._sent_since_ping:
            self._sent_since_ping = False
            self._pings.forgive()
        if self._pings.received(self._clock.monotonic_s(), idle=not self.streams):
            raise ConnectionFault(ENHANCE_YOUR_CALM, "too_many_pings")
        self._write_ack(frame(PING, ACK, 0, payload))

    def _write_ack(self, data: bytes) -> None:
        """ACKs of one read go out in one write, at the end of its parse or before the next
        frame written (a SETTINGS flood cost one send per frame; a SETTINGS ACK must precede
        frames that use the new settings: a client raising MAX_FRAME_SIZE rejects larger
        frames that arrive before our ACK)."""
        if self._paused:
            self._acks_while_paused += 1
            if self._acks_while_paused > self.limits.max_outbound_acks:
                raise ConnectionFault(ENHANCE_YOUR_CALM, "control frames not read (flood)")
        self._acks.append(data)

    def _on_rst_stream(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionFault(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionFault(FRAME_SIZE_ERROR, "RST_STREAM payload is not 4 bytes")
        if sid > self._last_sid:
            raise ConnectionFault(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        if not self._resets.take(self._clock.monotonic_s()):
            raise ConnectionFault(ENHANCE_YOUR_CALM, "stream reset rate exceeded")
        stream = self.streams.get(sid)
        if stream is not None:
            self._remove(stream)
            self.app.on_reset(self, stream)

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ConnectionFault(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionFault(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionFault(FRAME_SIZE_ERROR, "SETTINGS payload not a multiple of 6")
        if len(payload) // 6 > self.limits.max_settings_entries:
            raise ConnectionFault(ENHANCE_YOUR_CALM, "SETTINGS: too many setting entries")
        if not self._settings.take(self._clock.monotonic_s()):
            raise ConnectionFault(ENHANCE_YOUR_CALM, "too many SETTINGS frames")
        for pos in range(0, len(payload), 6):
            ident, value = SETTING.unpack_from(payload, pos)
            if ident == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionFault(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                delta = value - self._peer_stream_window
                self._peer_stream_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif ident == S_MAX_FRAME_SIZE:
                if not MAX_FRAME_SIZE <= value < 1 << 24:
                    raise ConnectionFault(PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self._peer_max_frame = value
            elif ident == S_ENABLE_PUSH and value > 1:
                raise ConnectionFault(PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1")
        self._write_ack(frame(SETTINGS, ACK, 0))
        self._flush_blocked()

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionFault(FRAME_SIZE_ERROR, "WINDOW_UPDATE payload is not 4 bytes")
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise ConnectionFault(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ConnectionFault(FLOW_CONTROL_ERROR, "connection window above 2^31-1")
            self._flush_blocked()
            return
        if sid > self._last_sid:
            raise ConnectionFault(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
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
            raise ConnectionFault(PROTOCOL_ERROR, f"HEADERS on stream {sid}")
        if flags & PADDED:
            payload = _unpad(payload)
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise ConnectionFault(FRAME_SIZE_ERROR, "HEADERS too short for PRIORITY")
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
            raise ConnectionFault(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._cont_count += 1
        if self._cont_count > self.limits.max_continuations:
            raise ConnectionFault(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        self._cont_block += payload
        self._check_block_size()
        if flags & END_HEADERS:
            self._cont_sid = 0
            block, self._cont_block = bytes(self._cont_block), bytearray()
            self._on_header_block(sid, block, self._cont_end)

    def _check_block_size(self) -> None:
        if len(self._cont_block) > self.limits.max_header_block:
            raise ConnectionFault(ENHANCE_YOUR_CALM, "header block too large")

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
            raise ConnectionFault(COMPRESSION_ERROR, f"HPACK: {err}") from None
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
                raise ConnectionFault(PROTOCOL_ERROR, "second HEADERS without END_STREAM")
            if not stream.remote_closed:
                stream.remote_closed = True
                self.app.on_end(self, stream)
            return
        if sid <= self._last_sid:
            raise ConnectionFault(STREAM_CLOSED, f"HEADERS on closed stream {sid}")
        self._last_sid = sid
        if self.going_away or self._peer_goaway:
            self._write(frame(RST_STREAM, 0, sid, U32.pack(REFUSED_STREAM)))
            return
        if len(self.streams) >= self.limits.max_concurrent_streams:
            self._write(frame(RST_STREAM, 0, sid, U32.pack(REFUSED_STREAM)))
            return
        stream = Stream(sid, headers, self._peer_stream_window, self.limits.stream_window)
        stream.remote_closed = end_stream
        self.streams[sid] = stream
        self.app.on_request(self, stream)
        if end_stream and self.streams.get(sid) is stream:
            self.app.on_end(self, stream)

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionFault(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise ConnectionFault(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        data = _unpad(payload) if flags & PADDED else payload
        if not size and not flags & END_STREAM:
            self._glitch("empty DATA")
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            if sid > self._last_sid:
                raise ConnectionFault(PROTOCOL_ERROR, "DATA on an idle stream")
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
            self._write(frame(WINDOW_UPDATE, 0, sid, U32.pack(increment)))
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
        self._write(frame(WINDOW_UPDATE, 0, 0, U32.pack(grant)))

    @property
    def buffered_input(self) -> int:
        return self._buffered

    @property
    def queued_output(self) -> int:
        return self._queued_out


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
        raise ConnectionFault(FRAME_SIZE_ERROR, "PADDED frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionFault(PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]
