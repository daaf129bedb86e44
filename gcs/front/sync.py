"""``ray.rpc.syncer.RaySyncer/StartSync`` served on the front server itself, a transport
of :class:`~gcs.services.ray_syncer.StartSync` (the behaviour, written once: metadata
``node_id``, batch bounds, INVALID_ARGUMENT naming the field, the hub, the call record).

Why: relayed through grpc.aio over the private socket, every view the hub sends to a raylet
crossed two HTTP/2 stacks and a grpc.aio stream write — about 2x the GCS CPU of grpc.aio
alone and 4x Ray's per relayed message (``bench/gcs/syncer_fleet_vs_ray.py``, churn).  Here
a peer costs no task: the hub calls the peer's notify when its outbox stops being empty;
once per loop turn every such peer gets its queued entries, already encoded, as one gRPC
message, and the DATA frames for all streams of one connection (a fleet's raylets share one)
go out in one write.  A peer that does not read (its stream's window is spent, data queued) gets
nothing more written: its outbox keeps coalescing to the newest view per node, checked again
after ``_BLOCKED_RETRY_S`` of the injected clock.
"""

from __future__ import annotations

import asyncio

import grpc

from gcs.base.background import Background
from gcs.base.clock import Clock, SystemClock
from gcs.front.grpc_framing import (
    OK_TRAILERS,
    RESPONSE_HEADERS,
    GrpcWireError,
    message_prefix,
    metadata_block,
    request_metadata,
    split_messages,
    trailers_block,
    trailers_only,
)
from gcs.front.h2 import H2ServerConnection, Stream
from gcs.managers.sync_hub import GCS_SYNCER_NODE_ID
from gcs.rpc.errors import InvalidArgument
from gcs.services.ray_syncer import StartSync, SyncSession

_BLOCKED_RETRY_S = 0.05
_HEADERS = RESPONSE_HEADERS + metadata_block((("node_id", GCS_SYNCER_NODE_ID),))


class SyncCall:
    """One raylet's stream (a stream's ``app`` state)."""

    __slots__ = ("body", "conn", "encoding", "ended", "scheduled", "session", "stream")

    def __init__(self, conn: H2ServerConnection, stream: Stream, encoding: bytes | None) -> None:
        self.conn = conn
        self.stream = stream
        self.encoding = encoding
        self.body = bytearray()
        self.session: SyncSession | None = None
        self.scheduled = False
        self.ended = False


class SyncDispatcher:
    def __init__(
        self,
        sync: StartSync,
        max_message_bytes: int,
        *,
        clock: Clock | None = None,
        background: Background | None = None,
    ) -> None:
        self._sync = sync
        self._max_message = max_message_bytes
        self._clock = clock if clock is not None else SystemClock()
        self._background = background if background is not None else Background("front-sync")
        self._pending: list[SyncCall] = []
        self._blocked: list[SyncCall] = []
        self._open: set[SyncCall] = set()

    def open(self, conn: H2ServerConnection, stream: Stream, encoding: bytes | None) -> SyncCall:
        call = SyncCall(conn, stream, encoding)
        try:
            session = self._sync.open(
                request_metadata(stream.headers), lambda: self._schedule(call)
            )
        except InvalidArgument as err:  # refused before the response headers
            call.ended = True
            conn.send_headers(
                stream,
                trailers_only(grpc.StatusCode.INVALID_ARGUMENT, err.message),
                end_stream=True,
            )
            return call
        call.session = session
        conn.send_headers(stream, _HEADERS)
        self._open.add(call)
        return call

    def end_all(self) -> None:
        """Shutting down: every stream ends (OK) now rather than holding the grace period
        (raylets reconnect to the next GCS after their back-off)."""
        for call in list(self._open):
            self._finish(call, grpc.StatusCode.OK, "")

    def on_data(
        self, conn: H2ServerConnection, stream: Stream, call: SyncCall, data: bytes
    ) -> None:
        session = call.session
        if session is None or call.ended:
            conn.release(stream, len(data))
            return
        body = call.body
        body += data
        try:
            for raw, size in split_messages(body, call.encoding, self._max_message):
                conn.release(stream, size)
                self._sync.receive(session, raw)
        except InvalidArgument as err:
            self._finish(call, grpc.StatusCode.INVALID_ARGUMENT, err.message)
        except GrpcWireError as err:
            self._finish(call, err.code, err.message)

    def on_end(self, conn: H2ServerConnection, stream: Stream, call: SyncCall) -> None:
        """The raylet is done writing: the stream ends (it reconnects if it wants more)."""
        self._finish(call, grpc.StatusCode.OK, "")

    def on_reset(self, call: SyncCall) -> None:
        self._finish(call, grpc.StatusCode.CANCELLED, "", send=False)

    async def close(self) -> None:
        """The blocked-peer retry ends."""
        await self._background.close()

    # ---------------------------------------------------------------- internals

    def _schedule(self, call: SyncCall) -> None:
        if not call.scheduled and not call.ended:
            call.scheduled = True
            self._pending.append(call)
            if len(self._pending) == 1:
                asyncio.get_running_loop().call_soon(self._flush_pending)

    def _flush_pending(self) -> None:
        """Every peer with something queued, once per loop turn, one write per connection."""
        pending, self._pending = self._pending, []
        corked: set[H2ServerConnection] = set()
        try:
            for call in pending:
                conn = call.conn
                if conn not in corked:
                    conn.cork()
                    corked.add(conn)
                self._flush(call)
        finally:
            for conn in corked:
                conn.uncork()

    def _flush(self, call: SyncCall) -> None:
        call.scheduled = False
        session = call.session
        if session is None or call.ended:
            return
        if session.peer.closed:  # replaced by a newer stream of the node, or the node died
            self._finish(call, grpc.StatusCode.OK, "")
            return
        conn, stream = call.conn, call.stream
        if conn.streams.get(stream.id) is not stream:  # the connection went away
            self._finish(call, grpc.StatusCode.CANCELLED, "", send=False)
            return
        if stream.out:  # the raylet is not reading: let its outbox coalesce meanwhile
            call.scheduled = True
            self._blocked.append(call)
            if len(self._blocked) == 1:
                self._background.spawn(self._retry_blocked(), "blocked-retry")
            return
        entries = self._sync.outgoing_entries(session)
        if entries:
            size = sum(map(len, entries))
            conn.send_message_parts(stream, [message_prefix(size), *entries], size + 5)
        if len(session.peer):
            self._schedule(call)

    async def _retry_blocked(self) -> None:
        """After ``_BLOCKED_RETRY_S``, every peer that was not reading is tried again."""
        await self._clock.sleep(_BLOCKED_RETRY_S)
        blocked, self._blocked = self._blocked, []
        for call in blocked:
            call.scheduled = False
            self._schedule(call)

    def _finish(
        self, call: SyncCall, code: grpc.StatusCode, message: str, *, send: bool = True
    ) -> None:
        if call.ended:
            return
        call.ended = True
        self._open.discard(call)
        session = call.session
        if session is None or not self._sync.finish(session, code) or not send:
            return
        if code is grpc.StatusCode.OK:
            call.conn.send_trailers(call.stream, OK_TRAILERS)
        else:
            call.conn.send_trailers(call.stream, trailers_block(code, message))
