"""Every stream the front server does not answer itself (reflection, health Watch, unknown
paths) goes to the grpc.aio server on its private socket: the call is re-issued through one
grpc.aio channel with identity (de)serializers, the client's metadata (``authorization``,
``ray_cluster_id``, ...) and its ``grpc-timeout`` as the deadline, as a bidirectional
stream, which covers every gRPC call shape; messages, status, details and metadata are
relayed back.  The grpc.aio server's interceptor checks forwarded calls as it checks direct
ones.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import structlog

from gcs.base.background import Background
from gcs.front.grpc_framing import (
    RESPONSE_HEADERS,
    GrpcWireError,
    Metadata,
    message_frame,
    metadata_block,
    split_messages,
    trailers_block,
    trailers_only,
)
from gcs.front.h2 import H2ServerConnection, Stream

log = structlog.get_logger("gcs.front")


class Forwarded:
    """One relayed stream (a stream's ``app`` state)."""

    __slots__ = ("body", "encoding", "metadata", "path", "queue", "task", "timeout")

    def __init__(
        self, path: str, metadata: Metadata, timeout: float | None, encoding: bytes | None
    ) -> None:
        self.path = path
        self.metadata = metadata
        self.timeout = timeout
        self.encoding = encoding
        self.body = bytearray()
        self.queue: asyncio.Queue[tuple[bytes, int] | None] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None


class Forwarder:
    def __init__(self, target: str, max_message_bytes: int) -> None:
        self._target = target
        self._max_message = max_message_bytes
        self._channel: grpc.aio.Channel | None = None
        self._streams: dict[str, Any] = {}
        self._background = Background("front-forward")
        """One task per relayed stream, and its writer and initial-metadata relay."""

    def _chan(self) -> grpc.aio.Channel:
        if self._channel is None:  # created on the serving loop
            self._channel = grpc.aio.insecure_channel(
                self._target,
                options=[
                    ("grpc.max_receive_message_length", self._max_message),
                    ("grpc.max_send_message_length", self._max_message),
                    ("grpc.http2.bdp_probe", 0),
                ],
            )
        return self._channel

    def open(
        self,
        conn: H2ServerConnection,
        stream: Stream,
        path: str,
        metadata: Metadata,
        timeout: float | None,
        encoding: bytes | None,
    ) -> Forwarded:
        fwd = Forwarded(path, metadata, timeout, encoding)
        self._spawn(fwd, self._relay_stream(conn, stream, fwd))
        return fwd

    def on_data(
        self, conn: H2ServerConnection, stream: Stream, fwd: Forwarded, data: bytes
    ) -> None:
        body = fwd.body
        body += data
        try:
            messages = split_messages(body, fwd.encoding, self._max_message)
        except GrpcWireError as err:
            self._fail(conn, stream, fwd, err.code, err.message)
            return
        for item in messages:
            fwd.queue.put_nowait(item)

    def on_end(self, conn: H2ServerConnection, stream: Stream, fwd: Forwarded) -> None:
        fwd.queue.put_nowait(None)

    def on_reset(self, fwd: Forwarded) -> None:
        if fwd.task is not None:
            fwd.task.cancel()

    async def close(self) -> None:
        await self._background.close()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    # ---------------------------------------------------------------- internals

    def _spawn(self, fwd: Forwarded, coro: Any) -> None:
        fwd.task = self._background.spawn(coro, "relay")

    def _fail(
        self,
        conn: H2ServerConnection,
        stream: Stream,
        fwd: Forwarded,
        code: grpc.StatusCode,
        message: str,
    ) -> None:
        if fwd.task is not None:
            fwd.task.cancel()
        conn.send_headers(stream, trailers_only(code, message), end_stream=True)

    async def _relay_stream(self, conn: H2ServerConnection, stream: Stream, fwd: Forwarded) -> None:
        callable_ = self._streams.get(fwd.path)
        if callable_ is None:
            callable_ = self._streams[fwd.path] = self._chan().stream_stream(fwd.path)
        call = callable_(metadata=fwd.metadata, timeout=fwd.timeout)
        pump = self._background.spawn(self._pump(conn, stream, call, fwd.queue), "relay-writer")
        headers_sent = False

        async def send_initial(*, unless_done: bool) -> None:
            """Relay the server's initial metadata as soon as it is sent, not with the first
            message: a stream such as RaySyncer/StartSync names its peer in it before any
            message flows.  A call that ends with no message is answered trailers-only."""
            nonlocal headers_sent
            initial = await call.initial_metadata()
            if not headers_sent and not (unless_done and call.done()):
                conn.send_headers(stream, RESPONSE_HEADERS + metadata_block(tuple(initial or ())))
                headers_sent = True

        headers = self._background.spawn(send_initial(unless_done=True), "relay-headers")
        try:
            try:
                async for message in call:
                    if not headers_sent:
                        await send_initial(unless_done=False)
                    conn.send_data(stream, message_frame(message))
                code = await call.code()
                details = await call.details()
                trailing = tuple(await call.trailing_metadata() or ())
            except grpc.aio.AioRpcError as err:
                code, details = err.code(), err.details() or ""
                trailing = (*(err.initial_metadata() or ()), *(err.trailing_metadata() or ()))
            if headers_sent:
                conn.send_trailers(stream, trailers_block(code, details, trailing))
            else:
                conn.send_headers(stream, trailers_only(code, details, trailing), end_stream=True)
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            for task in (pump, headers):
                if task is not None:
                    task.cancel()

    @staticmethod
    async def _pump(
        conn: H2ServerConnection,
        stream: Stream,
        call: Any,
        queue: asyncio.Queue[tuple[bytes, int] | None],
    ) -> None:
        try:
            while True:
                item = await queue.get()
                if item is None:
                    await call.done_writing()
                    return
                message, size = item
                await call.write(message)
                conn.release(stream, size)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the call ended: its status is relayed by the reader
            log.debug("front.forward_write_failed", error=repr(err))
