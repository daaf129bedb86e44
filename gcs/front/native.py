"""Every other unary method, answered on the front server by the very method handlers the
grpc.aio server was given (:func:`gcs.rpc.server.service_handler`'s table: its request
decoding, error mapping and metrics), one task per call (spawned through the router's
:class:`~gcs.base.background.Background`), with a :class:`FrontContext`.

Status and details are what grpc.aio answers: the handler's ``set_code`` / ``abort``; an
exception escaping a handler (only third-party ones, such as health's deserializer) is
``Unexpected <type>: <error>`` with the code the handler set, else UNKNOWN;
``grpc-timeout`` (on the injected clock, :mod:`.deadlines`) cancels the task with
DEADLINE_EXCEEDED; the client's RST_STREAM cancels it.  A sync handler (none of ours) runs
on the loop, where grpc.aio would use a thread.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

import grpc
import structlog

from gcs.base.background import Background
from gcs.base.clock import Clock
from gcs.front.body import RequestBody, prefix_refusal, request_limit
from gcs.front.deadlines import Deadline, Deadlines
from gcs.front.grpc_framing import (
    OK_TRAILERS,
    RESPONSE_HEADERS,
    GrpcWireError,
    Header,
    Metadata,
    message_frame,
    request_metadata,
    trailers_only,
)
from gcs.front.h2 import H2ServerConnection, Stream
from gcs.rpc.server import BoundedHandler, CallHook, RequestBound, SplicedReply
from gcs.rpc.warnings import WarningSampler

log = structlog.get_logger("gcs.front")

_SMALL_REPLY = 64 << 10
"""Replies up to this are framed with their prefix in one piece (one write)."""


@dataclass(frozen=True, slots=True)
class NativeMethod:
    path: str
    behaviour: Callable[[Any, Any], Awaitable[Any]]
    deserializer: Callable[[bytes | memoryview], Any] | None
    serializer: Callable[[Any], bytes] | None
    bound: RequestBound | None = None
    """The request limit the handler applies (our handlers); checked against the gRPC
    length prefix as soon as it arrives, with the handler's own answer."""


class _CallDetails(NamedTuple):
    method: str
    invocation_metadata: tuple[()]


def native_methods(
    handlers: Iterable[grpc.GenericRpcHandler], paths: Iterable[str]
) -> dict[str, NativeMethod]:
    """Path -> the unary-unary method handler the first of ``handlers`` serving it gives
    (as grpc.aio looks it up); streaming and unserved paths are left out."""
    handlers = list(handlers)
    out: dict[str, NativeMethod] = {}
    for path in paths:
        for generic in handlers:
            found = generic.service(_CallDetails(path, ()))  # type: ignore[arg-type]
            if found is None:
                continue
            if not (found.request_streaming or found.response_streaming):
                bounds = generic.bounds if isinstance(generic, BoundedHandler) else {}
                out[path] = NativeMethod(
                    path,
                    found.unary_unary,
                    found.request_deserializer,
                    found.response_serializer,
                    bounds.get(path),
                )
            break
    return out


def serves(handlers: Iterable[grpc.GenericRpcHandler], path: str) -> bool:
    """Whether one of ``handlers`` serves ``path`` (as grpc.aio looks it up)."""
    details = _CallDetails(path, ())
    return any(generic.service(details) is not None for generic in handlers)  # type: ignore[arg-type]


class FrontContext:
    """What handlers use of ``grpc.aio.ServicerContext``."""

    __slots__ = ("_clock", "_code", "_conn", "_deadline", "_details", "_headers", "_trailers")

    def __init__(
        self,
        headers: list[Header],
        deadline: float | None,
        conn: H2ServerConnection,
        clock: Clock,
    ) -> None:
        self._headers = headers
        self._deadline = deadline
        """On ``clock``'s monotonic seconds."""
        self._conn = conn
        self._clock = clock
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailers: Metadata = ()

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def set_trailing_metadata(self, metadata: Metadata) -> None:
        self._trailers = tuple(metadata)

    def trailing_metadata(self) -> Metadata:
        return self._trailers

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Metadata = ()
    ) -> NoReturn:
        self._code = code
        self._details = details
        if trailing_metadata:
            self._trailers = tuple(trailing_metadata)
        raise grpc.aio.AbortError()

    def invocation_metadata(self) -> Metadata:
        return request_metadata(self._headers)

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(self._deadline - self._clock.monotonic_s(), 0.0)

    def peer(self) -> str:
        """As grpc names it: ``ipv4:host:port``, ``ipv6:[host]:port`` or ``unix:path``."""
        transport = self._conn.transport
        name = transport.get_extra_info("peername") if transport is not None else None
        if isinstance(name, tuple) and len(name) >= 2:
            host, port = name[0], name[1]
            return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        return f"unix:{name}" if name else "unknown"


class NativeCall:
    """One call of a native method (a stream's ``app`` state)."""

    __slots__ = ("body", "encoding", "method", "task", "timeout", "timer")

    def __init__(self, method: NativeMethod, timeout: float | None, encoding: bytes | None):
        self.method = method
        self.timeout = timeout
        self.encoding = encoding
        self.body = RequestBody()
        self.task: asyncio.Task[None] | None = None
        self.timer: Deadline | None = None


class NativeDispatcher:
    def __init__(
        self,
        max_message_bytes: int,
        deadlines: Deadlines,
        background: Background,
        clock: Clock,
        on_call: CallHook | None = None,
        warnings: WarningSampler | None = None,
    ) -> None:
        self._max_message = max_message_bytes
        self._deadlines = deadlines
        self._background = background
        self._clock = clock
        self._on_call = on_call
        self._warnings = warnings

    def on_data(
        self, conn: H2ServerConnection, stream: Stream, call: NativeCall, data: bytes
    ) -> None:
        bound = call.method.bound
        limit = request_limit(self._max_message, bound.max_request_bytes if bound else None)
        body = call.body
        body.add(conn, stream, data, limit + 5)
        if body.declared > limit:  # refused at the length prefix, before the body arrives
            path = call.method.path
            code, details, counted = prefix_refusal(
                path,
                body.declared,
                self._max_message,
                bound.message_cls if bound else None,
                bound.max_request_bytes if bound else None,
                self._warnings,
            )
            conn.send_headers(stream, trailers_only(code, details), end_stream=True)
            if counted and self._on_call is not None:
                self._on_call(path, code.name, 0.0)

    def on_end(self, conn: H2ServerConnection, stream: Stream, call: NativeCall) -> None:
        try:
            raw, _ = call.body.take(conn, stream, call.encoding, self._max_message)
        except GrpcWireError as err:
            conn.send_headers(stream, trailers_only(err.code, err.message), end_stream=True)
            return
        clock = self._clock
        deadline = None if call.timeout is None else clock.monotonic_s() + call.timeout
        context = FrontContext(stream.headers, deadline, conn, clock)
        call.task = self._background.spawn(self._run(conn, stream, call, raw, context))
        if call.timeout is not None:
            call.timer = self._deadlines.add(call.timeout, self._expire, conn, stream, call)

    def on_reset(self, call: NativeCall) -> None:
        """The client went away: the handler is cancelled."""
        if call.timer is not None:
            call.timer.cancel()
        if call.task is not None:
            call.task.cancel()

    def _expire(self, conn: H2ServerConnection, stream: Stream, call: NativeCall) -> None:
        call.timer = None
        if call.task is not None and not call.task.done():
            call.task.cancel()
            conn.send_headers(
                stream,
                trailers_only(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
                end_stream=True,
            )

    async def _run(
        self,
        conn: H2ServerConnection,
        stream: Stream,
        call: NativeCall,
        raw: bytes | memoryview,
        context: FrontContext,
    ) -> None:
        method = call.method
        parts: tuple[bytes, ...] = ()
        try:
            request = raw if method.deserializer is None else method.deserializer(raw)
            result = method.behaviour(request, context)
            if inspect.isawaitable(result):  # a sync handler ran inline (grpc.aio: a thread)
                result = await result
            code = context.code()
            if code is not None and code is not grpc.StatusCode.OK:
                pass
            elif isinstance(result, SplicedReply):
                parts = result.parts
            else:
                parts = (result if method.serializer is None else method.serializer(result),)
        except grpc.aio.AbortError:
            pass
        except Exception as exc:  # what grpc.aio answers for an exception out of a handler
            log.exception("front.handler_failed", method=method.path)
            if context.code() in (None, grpc.StatusCode.OK):
                context.set_code(grpc.StatusCode.UNKNOWN)
            context.set_details(f"Unexpected {type(exc)}: {exc}")
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        code = context.code()
        size = sum(len(part) for part in parts)
        if code is not None and code is not grpc.StatusCode.OK:
            conn.send_headers(
                stream,
                trailers_only(code, context.details(), context.trailing_metadata()),
                end_stream=True,
            )
        elif size > self._max_message:
            message = f"SERVER: Sent message larger than max ({size} vs. {self._max_message})"
            conn.send_headers(
                stream,
                trailers_only(grpc.StatusCode.RESOURCE_EXHAUSTED, message),
                end_stream=True,
            )
        elif size <= _SMALL_REPLY:
            reply = parts[0] if len(parts) == 1 else b"".join(parts)
            conn.send_reply(stream, RESPONSE_HEADERS, message_frame(reply), OK_TRAILERS)
        elif not conn.can_queue(size):
            message = (
                f"the server's reply buffers (front_buffer_budget_bytes) are in use by other "
                f"clients; the {size}-byte reply does not fit now, retry"
            )
            conn.send_headers(
                stream,
                trailers_only(grpc.StatusCode.RESOURCE_EXHAUSTED, message),
                end_stream=True,
            )
        else:  # the reply is held once, as encoded, and written as the client reads
            conn.send_headers(stream, RESPONSE_HEADERS)
            conn.send_data(stream, b"\x00" + size.to_bytes(4))
            for part in parts:
                conn.send_data(stream, part)
            conn.send_trailers(stream, OK_TRAILERS)
