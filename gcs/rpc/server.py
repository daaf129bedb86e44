"""Turn a servicer object into a gRPC handler for Ray's method paths.

A servicer is any object with ``async def Method(self, request, context) -> reply`` for the
RPCs it implements.  Unimplemented methods answer UNIMPLEMENTED.  Exceptions are mapped in
one place: :class:`GcsError` -> its status; anything else -> INTERNAL (never UNKNOWN, which
Ray's clients retry forever).  Cancellation passes through.

Requests are decoded inside the wrapper, not by gRPC's deserializer: a decode failure there
becomes UNKNOWN before any of our code runs (no log line, no metric).  Here it is
INVALID_ARGUMENT naming the message type, logged and counted like any other call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from gcs.base.handler_delays import Pause
from gcs.rpc.errors import InvalidArgument, status_for, trailers_for
from gcs.rpc.method_paths import method_path, wire_service_name
from gcs.rpc.warnings import WarningSampler

log = structlog.get_logger("gcs.rpc")

Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
CallHook = Callable[[str, str, float], None]
"""(method path, grpc code name, seconds) after every call: metrics."""

LONG_POLL_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_concurrent_streams", 1 << 20),
    ("grpc.server.max_pending_requests", 1 << 20),
    ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
    ("grpc.http2.bdp_probe", 0),
)
"""Server channel args for thousands of concurrent long polls.

gRPC core queues calls that arrive before the application asks for the next one, and
cancels them past ``max_pending_requests`` (default 1,000; randomly up to the hard limit
3,000, all beyond).  ``grpc.aio`` accepts calls one at a time on the event loop, so the
burst of re-polls after one publish to 2,000 subscribers got about a third of them
CANCELLED (measured), each then retried after the client's backoff.

BDP probing is off: with it gRPC answers received data with a PING (and reads the ACK), so
every long-poll round trip cost ~2.7 sendmsg and ~4.2 recvmsg instead of 2 and 2.7, and
18 % more server CPU per publish at 2,000 subscribers (bench/pubsub/vs_ray.py, floor
server, same run).  Control-plane messages are small; the static 64 KiB stream window is
ample on a cluster network.
"""


def check_request_size(
    path: str,
    size: int,
    message_cls: Any,
    max_request_bytes: int | None,
    warnings: WarningSampler | None = None,
) -> None:
    """A request of ``size`` encoded bytes above ``max_request_bytes`` is
    :class:`InvalidArgument` naming the limit (logged, sampled).  The front server calls it
    as soon as the gRPC length prefix arrives, before buffering the body."""
    if max_request_bytes is not None and size > max_request_bytes:
        _warn(warnings, "rpc.request_too_large", method=path, bytes=size)
        raise InvalidArgument(
            f"request is {size} bytes; a {message_cls.DESCRIPTOR.name} is limited to "
            f"{max_request_bytes} bytes"
        )


def decode_request(
    path: str,
    raw: bytes | memoryview,
    message_cls: Any,
    max_request_bytes: int | None,
    size: int = -1,
    warnings: WarningSampler | None = None,
) -> Any:
    """The request of ``path``, bounded and decoded; a bad one is :class:`InvalidArgument`
    (logged, sampled).  Shared by the grpc.aio wrapper and the front server (gcs.front),
    which passes the declared ``size`` of a message it did not keep whole."""
    size = len(raw) if size < 0 else size
    if max_request_bytes is not None and size > max_request_bytes:  # (no call on the hot path)
        check_request_size(path, size, message_cls, max_request_bytes, warnings)
    try:
        return message_cls.FromString(raw)
    except DecodeError as exc:
        _warn(warnings, "rpc.undecodable_request", method=path, bytes=len(raw))
        raise InvalidArgument(
            f"request is not a valid {message_cls.DESCRIPTOR.name}: {exc}"
        ) from None


def _warn(warnings: WarningSampler | None, event: str, **fields: Any) -> None:
    if warnings is not None:
        warnings.warn(event, **fields)
    else:
        log.warning(event, **fields)


def failure_status(path: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status a failed call answers with: the one table, else INTERNAL (logged)."""
    mapped = status_for(exc)
    if mapped is None:
        log.exception("rpc.handler_failed", method=path)
        mapped = (grpc.StatusCode.INTERNAL, f"internal error: {exc!r}")
    return mapped


def _wrap(
    path: str,
    fn: Handler,
    message_cls: Any,
    on_call: CallHook | None,
    max_request_bytes: int | None = None,
    warnings: WarningSampler | None = None,
    pause: Pause | None = None,
) -> Handler:
    async def handler(raw: bytes | memoryview, context: grpc.aio.ServicerContext) -> Any:
        start = time.perf_counter()
        code = "OK"
        try:
            if pause is not None:  # Ray's testing_asio_delay_us (gcs.base.handler_delays)
                await pause()
            request = decode_request(path, raw, message_cls, max_request_bytes, -1, warnings)
            return await fn(request, context)
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except grpc.aio.AbortError:
            code = str(context.code().name if context.code() else "ABORTED")
            raise
        except Exception as exc:  # the one place that turns an error into a clean status
            status, details = failure_status(path, exc)
            code = status.name
            # Set the status and return instead of ``context.abort``: abort's exception keeps
            # a reference cycle (call state -> exception -> traceback -> frames -> call state)
            # that holds the request until a full GC, megabytes per rejected call.
            context.set_code(status)
            context.set_details(details)
            trailers = trailers_for(exc)
            if trailers:  # a Ray-style status's message (gcs.rpc.errors)
                context.set_trailing_metadata(trailers)
            return b""
        finally:
            if on_call is not None:
                on_call(path, code, time.perf_counter() - start)

    return handler


def _unimplemented(path: str) -> Handler:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{path} is not implemented")

    return handler


@dataclass(frozen=True, slots=True)
class RequestBound:
    """What a unary method accepts: its request type and encoded-size limit (None: only
    gRPC's message limit)."""

    message_cls: Any
    max_request_bytes: int | None


class BoundedHandler(grpc.GenericRpcHandler):
    """A service's method handlers, and each method's :class:`RequestBound` (by path) for
    the front server, which checks the gRPC length prefix before buffering a request."""

    def __init__(self, inner: grpc.GenericRpcHandler, bounds: dict[str, RequestBound]) -> None:
        self._inner = inner
        self.bounds = bounds

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return self._inner.service(handler_call_details)


def service_handler(
    service: ServiceDescriptor,
    servicer: object,
    *,
    on_call: CallHook | None = None,
    max_request_bytes: int | None = None,
    max_request_bytes_by_method: Mapping[str, int] | None = None,
    warnings: WarningSampler | None = None,
    pauses: Callable[[str, str], Pause | None] | None = None,
) -> BoundedHandler:
    """``max_request_bytes`` bounds the encoded request before it is decoded (a decoded
    message can take ~30x its encoded size); ``max_request_bytes_by_method`` overrides it
    per method name.  None: only gRPC's message limit applies.  ``warnings`` samples the
    bad-request log lines (one per request otherwise).  ``pauses(service, method)``: what a
    method's handler awaits first (Ray's ``testing_asio_delay_us``), None for nothing."""
    handlers = {}
    bounds = {}
    by_method = max_request_bytes_by_method or {}
    for method in service.methods:
        if method.client_streaming or method.server_streaming:
            continue
        path = method_path(method)
        fn = getattr(servicer, method.name, None)
        message_cls = GetMessageClass(method.input_type)
        limit = by_method.get(method.name, max_request_bytes)
        bounds[path] = RequestBound(message_cls, limit)
        pause = pauses(service.name, method.name) if pauses is not None else None
        impl = (
            _wrap(path, fn, message_cls, on_call, limit, warnings, pause)
            if fn is not None
            else _unimplemented(path)
        )
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            impl,
            request_deserializer=None,  # raw bytes: decoded in the wrapper (see module doc)
            response_serializer=_serialize,
        )
    inner = grpc.method_handlers_generic_handler(wire_service_name(service), handlers)
    return BoundedHandler(inner, bounds)


class SplicedReply:
    """A reply already encoded, in parts: a large value is spliced in as it is instead of
    being copied into a message and again into its encoding.  The front server writes the
    parts as they are; grpc.aio gets them joined."""

    __slots__ = ("parts", "size")

    def __init__(self, *parts: bytes) -> None:
        self.parts = parts
        self.size = sum(len(part) for part in parts)


def _serialize(message: Any) -> bytes:
    """Replies may be pre-serialized bytes (hot paths splice cached parts)."""
    if isinstance(message, bytes):
        return message
    if isinstance(message, SplicedReply):
        return b"".join(message.parts)
    return message.SerializeToString()


class HandlerTable:
    """Registers handlers on a grpc.aio server and keeps them, so the front server
    (gcs.front) answers with the very same table.  Passed where a server is expected
    (``add_HealthServicer_to_server``, ``enable_server_reflection``)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server
        self.handlers: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.handlers.extend(handlers)
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        self.server.add_registered_method_handlers(service, handlers)  # type: ignore[attr-defined]
