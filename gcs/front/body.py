"""A unary call's request body on the front server: DATA kept up to a cap (the rest only
counted and released), then the one gRPC message taken out of it.  The 5-byte gRPC length
prefix says how large the message will be: a request above its method's limit is refused
as soon as the prefix arrives (:func:`prefix_refusal`), before its body is buffered."""

from __future__ import annotations

from typing import Any

import grpc

from gcs.front.grpc_framing import GrpcWireError, inflate
from gcs.front.h2 import H2ServerConnection, Stream
from gcs.rpc.errors import InvalidArgument
from gcs.rpc.server import check_request_size, failure_status
from gcs.rpc.warnings import WarningSampler

VIEW_MIN_BYTES = 1 << 20
"""A request at least this large is decoded from the connection's buffer itself (a
``memoryview``): a 511 MiB KV put was copied twice here (``bytes`` of the buffer, then the
slice after the prefix), two more 511 MiB allocations on the event loop, ~3 s each on a
loaded 2-core machine.  Smaller ones are one ``bytes`` copy, as handlers have always had."""


def request_limit(max_message: int, max_request_bytes: int | None) -> int:
    """The most a request of a method may declare in its length prefix."""
    return max_message if max_request_bytes is None else min(max_message, max_request_bytes)


def prefix_refusal(
    path: str,
    declared: int,
    max_message: int,
    message_cls: Any,
    max_request_bytes: int | None,
    warnings: WarningSampler | None,
) -> tuple[grpc.StatusCode, str, bool]:
    """The answer to a request whose prefix declares ``declared`` bytes, above its limit:
    what the method would answer once the body arrived (grpc's RESOURCE_EXHAUSTED above the
    message limit, else the handler's INVALID_ARGUMENT naming the limit), and whether the
    handler would have counted the call in the RPC metrics."""
    if declared > max_message:
        message = f"SERVER: Received message larger than max ({declared} vs. {max_message})"
        return grpc.StatusCode.RESOURCE_EXHAUSTED, message, False
    try:
        check_request_size(path, declared, message_cls, max_request_bytes, warnings)
    except InvalidArgument as exc:
        code, details = failure_status(path, exc)
        return code, details, True
    raise ValueError(f"{declared} bytes is within the limit of {path}")


class RequestBody:
    __slots__ = ("data", "declared")

    def __init__(self) -> None:
        self.data = bytearray()
        self.declared = -1

    def add(self, conn: H2ServerConnection, stream: Stream, data: bytes, cap: int) -> None:
        """Keep at most ``cap`` bytes (prefix included); release the rest at once."""
        body = self.data
        room = cap - len(body)
        if room > 0:
            body += data[:room] if len(data) > room else data
        if len(data) > room:
            conn.release(stream, len(data) - max(room, 0))
        if self.declared < 0 and len(body) >= 5:
            self.declared = int.from_bytes(body[1:5])

    def take(
        self, conn: H2ServerConnection, stream: Stream, encoding: bytes | None, max_message: int
    ) -> tuple[bytes | memoryview, int]:
        """The message and its declared size (-1 once inflated), as grpc.aio would receive
        it (a view of the buffer from :data:`VIEW_MIN_BYTES` on); a request that is not one
        valid message is :class:`GrpcWireError`."""
        body, self.data = self.data, bytearray()  # ours now: never resized again
        conn.release(stream, stream.buffered)
        if len(body) < 5:
            message = "truncated gRPC message prefix" if body else "request without a message"
            raise GrpcWireError(grpc.StatusCode.INTERNAL, message)
        if self.declared > max_message:
            raise GrpcWireError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"SERVER: Received message larger than max ({self.declared} vs. {max_message})",
            )
        view = memoryview(body).toreadonly()[5 : 5 + self.declared]
        if body[0]:  # compressed (grpc-encoding): inflated as grpc.aio would
            return inflate(view, encoding, max_message), -1
        if self.declared >= VIEW_MIN_BYTES:  # decoded from the buffer itself, not a copy
            return view, self.declared
        return bytes(view), self.declared
