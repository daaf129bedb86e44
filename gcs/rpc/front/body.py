"""A unary call's request body on the front server: DATA kept up to a cap (the rest only
counted and released), then the one gRPC message taken out of it."""

from __future__ import annotations

import grpc

from gcs.rpc.front.grpc_wire import GrpcWireError, inflate
from gcs.rpc.front.h2 import H2ServerConnection, Stream


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
    ) -> tuple[bytes, int]:
        """The message and its declared size (-1 once inflated), as grpc.aio would receive
        it; a request that is not one valid message is :class:`GrpcWireError`."""
        body, self.data = bytes(self.data), bytearray()
        conn.release(stream, stream.buffered)
        if len(body) < 5:
            message = "truncated gRPC message prefix" if body else "request without a message"
            raise GrpcWireError(grpc.StatusCode.INTERNAL, message)
        if self.declared > max_message:
            raise GrpcWireError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"SERVER: Received message larger than max ({self.declared} vs. {max_message})",
            )
        raw = body[5 : 5 + self.declared]
        if body[0]:  # compressed (grpc-encoding): inflated as grpc.aio would
            return inflate(raw, encoding, max_message), -1
        return raw, self.declared
