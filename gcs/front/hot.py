"""The pubsub methods the front server answers itself, through the same servicer objects,
request decoding and error mapping as the grpc.aio path (no behaviour fork).

A held ``GcsSubscriberPoll`` costs no task and no coroutine: the publisher's future gets a
done-callback that writes one HEADERS + DATA + trailers burst.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from gcs.front.body import RequestBody, prefix_refusal
from gcs.front.deadlines import Deadline, Deadlines
from gcs.front.grpc_framing import (
    OK_TRAILERS,
    RESPONSE_HEADERS,
    GrpcWireError,
    message_frame,
    trailers_only,
)
from gcs.front.h2 import H2ServerConnection, Stream
from gcs.rpc.errors import trailers_for
from gcs.rpc.method_paths import method_path
from gcs.rpc.server import CallHook, decode_request, failure_status
from gcs.rpc.warnings import WarningSampler
from gcs.services.pubsub import PubSubServicer


@dataclass(frozen=True, slots=True)
class HotMethod:
    path: str
    message_cls: Any
    max_request_bytes: int | None
    call: Callable[[Any], Any]
    """Sync entry point: returns the reply message, or (poll) a future of a ``PollReply``."""
    held: bool


def hot_methods(
    servicers: Sequence[tuple[ServiceDescriptor, PubSubServicer]],
    max_request_bytes: int | None,
) -> dict[str, HotMethod]:
    """Path -> method for GcsSubscriberPoll, GcsSubscriberCommandBatch and GcsPublish of
    each pubsub service."""
    out: dict[str, HotMethod] = {}
    for descriptor, servicer in servicers:
        entry_points = {
            "GcsSubscriberPoll": (servicer.poll, True),
            "GcsSubscriberCommandBatch": (servicer.command_batch, False),
            "GcsPublish": (servicer.publish, False),
        }
        for name, (call, held) in entry_points.items():
            method = descriptor.methods_by_name[name]
            path = method_path(method)
            cls = GetMessageClass(method.input_type)
            out[path] = HotMethod(path, cls, max_request_bytes, call, held)
    return out


class HotCall:
    """One call of a hot method (a stream's ``app`` state)."""

    __slots__ = ("body", "encoding", "future", "method", "start", "timeout", "timer")

    def __init__(self, method: HotMethod, timeout: float | None, encoding: bytes | None) -> None:
        self.method = method
        self.encoding = encoding
        self.body = RequestBody()
        self.start = 0.0
        self.future: asyncio.Future[Any] | None = None
        self.timer: Deadline | None = None
        self.timeout = timeout


class HotDispatcher:
    def __init__(
        self,
        on_call: CallHook | None,
        max_message_bytes: int,
        deadlines: Deadlines,
        warnings: WarningSampler | None = None,
    ) -> None:
        self._deadlines = deadlines
        self._on_call = on_call
        self._max_message = max_message_bytes
        self._warnings = warnings
        self._last_wire: bytes | None = None
        self._last_framed = b""

    def on_data(self, conn: H2ServerConnection, stream: Stream, call: HotCall, data: bytes) -> None:
        """Keep at most the request limit (+ the 5-byte prefix); a prefix declaring more is
        refused at once."""
        method = call.method
        limit = method.max_request_bytes
        if limit is None or limit > self._max_message:
            limit = self._max_message
        body = call.body
        body.add(conn, stream, data, limit + 5)
        if body.declared > limit:
            call.start = time.perf_counter()
            code, details, counted = prefix_refusal(
                method.path,
                body.declared,
                self._max_message,
                method.message_cls,
                method.max_request_bytes,
                self._warnings,
            )
            conn.send_headers(stream, trailers_only(code, details), end_stream=True)
            if counted:
                self._record(call, code.name)

    def on_end(self, conn: H2ServerConnection, stream: Stream, call: HotCall) -> None:
        method = call.method
        call.start = time.perf_counter()
        try:
            raw, size = call.body.take(conn, stream, call.encoding, self._max_message)
            request = decode_request(
                method.path, raw, method.message_cls, method.max_request_bytes, size, self._warnings
            )
            result = method.call(request)
        except GrpcWireError as err:
            self._fail_status(conn, stream, call, err.code, err.message)
            return
        except Exception as exc:
            code, details = failure_status(method.path, exc)
            self._fail_status(conn, stream, call, code, details, trailers_for(exc))
            return
        if not method.held:
            self._reply(conn, stream, call, result.SerializeToString())
            return
        if result.done():
            self._poll_done(conn, stream, call, result)
            return
        call.future = result
        result.add_done_callback(lambda fut: self._poll_done(conn, stream, call, fut))
        if call.timeout is not None:
            call.timer = self._deadlines.add(call.timeout, self._expire, conn, stream, call)

    def on_reset(self, call: HotCall) -> None:
        """The client went away: a held poll is cancelled (its messages stay queued)."""
        future, call.future = call.future, None
        if call.timer is not None:
            call.timer.cancel()
        if future is not None and not future.done():
            future.cancel()
            self._record(call, "CANCELLED")

    def _expire(self, conn: H2ServerConnection, stream: Stream, call: HotCall) -> None:
        call.timer = None
        future, call.future = call.future, None
        if future is not None and not future.done():
            future.cancel()
            self._fail_status(
                conn, stream, call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
            )

    def _poll_done(
        self, conn: H2ServerConnection, stream: Stream, call: HotCall, fut: asyncio.Future[Any]
    ) -> None:
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if call.future is not fut and call.future is not None:
            return
        call.future = None
        if fut.cancelled():
            if conn.streams.get(stream.id) is stream:  # the publisher dropped it
                self._fail_status(conn, stream, call, grpc.StatusCode.CANCELLED, "Cancelled")
            return
        exc = fut.exception()
        if exc is not None:
            code, details = failure_status(call.method.path, exc)  # type: ignore[arg-type]
            self._fail_status(conn, stream, call, code, details, trailers_for(exc))
            return
        wire = fut.result().wire
        if wire is not self._last_wire:  # one publish: the same bytes for every subscriber
            self._last_wire = wire
            self._last_framed = message_frame(wire)
        conn.send_reply(stream, RESPONSE_HEADERS, self._last_framed, OK_TRAILERS, counted=False)
        self._record(call, "OK")

    def _reply(self, conn: H2ServerConnection, stream: Stream, call: HotCall, msg: bytes) -> None:
        conn.send_reply(stream, RESPONSE_HEADERS, message_frame(msg), OK_TRAILERS)
        self._record(call, "OK")

    def _fail_status(
        self,
        conn: H2ServerConnection,
        stream: Stream,
        call: HotCall,
        code: grpc.StatusCode,
        details: str,
        trailers: tuple[tuple[str, bytes], ...] = (),
    ) -> None:
        conn.send_headers(stream, trailers_only(code, details, trailers), end_stream=True)
        self._record(call, code.name)

    def _record(self, call: HotCall, code: str) -> None:
        if self._on_call is not None and call.start:
            self._on_call(call.method.path, code, time.perf_counter() - call.start)
