"""Writing a connection: replies, headers, DATA and trailers within the peer's windows and
frame size, written in pieces while the socket drains; what waits on a peer that does not
read is bounded per connection and by the server-wide budget (beyond either: GOAWAY
ENHANCE_YOUR_CALM).
"""

from __future__ import annotations

from collections import deque

from gcs.front.h2_base import OUTPUT_FLOOR, U32, ConnectionState, Stream
from gcs.rpc.h2_frames import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    HEADERS,
    NO_ERROR,
    RST_STREAM,
    frame,
    frame_header,
)

_FAST_REPLY_MAX = 256 << 10
"""Larger replies go out in pieces as the socket drains, never whole into its buffer."""
_WRITE_BATCH = 256 << 10


class FrameOutput(ConnectionState):
    """The writing half of :class:`~gcs.front.h2.H2ServerConnection`."""

    __slots__ = ()

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

    def send_message_parts(self, stream: Stream, parts: list[bytes], size: int) -> None:
        """One gRPC message whose bytes are ``parts`` (``size`` in all, the 5-byte prefix
        included) as DATA.  While corked, and when the message fits the windows and one
        frame, the parts join the cork as they are: :meth:`uncork` hands them to the
        transport in one ``writelines``, so a fan-out copies no message in Python (a
        relayed syncer view grows with the bundles on its node).  Else as :meth:`send_data`.
        """
        cork = self._cork
        if (
            cork is not None
            and not self._acks
            and not stream.out_len
            and not self._paused
            and 0 < size <= self._send_window
            and size <= stream.send_window
            and size <= self._peer_max_frame
            and size <= _WRITE_BATCH
            and self.transport is not None
            and not self.closed
            and self.streams.get(stream.id) is stream
        ):
            self._sent_since_ping = True
            self._send_window -= size
            stream.send_window -= size
            cork.append(frame_header(size, DATA, 0, stream.id))
            cork.extend(parts)
            return
        self.send_data(stream, b"".join(parts))

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
            self._write(frame(RST_STREAM, 0, stream.id, U32.pack(code)))

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
            self._write(frame(RST_STREAM, 0, stream.id, U32.pack(NO_ERROR)))

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
        """What was corked, in one ``writelines`` (the transport gathers the pieces)."""
        cork, self._cork = self._cork, None
        if not cork:
            return
        transport = self.transport
        if transport is None or self.closed:
            return
        if self._acks:
            cork[:0], self._acks = self._acks, []
        transport.writelines(cork)
        if self._paused:
            self._check_output_bound()

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
