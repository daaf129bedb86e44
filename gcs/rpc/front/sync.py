"""``ray.rpc.syncer.RaySyncer/StartSync`` served on the front server itself, onto the same
:class:`~gcs.managers.sync_hub.SyncHub` and with the same checks as the grpc.aio servicer
(:mod:`gcs.services.ray_syncer`: metadata ``node_id``, batch bounds, INVALID_ARGUMENT naming the
field).

Why: relayed through grpc.aio over the private socket, every view the hub sends to a raylet
crossed two HTTP/2 stacks and a grpc.aio stream write — about 2x the GCS CPU of grpc.aio
alone and 4x Ray's per relayed message (``bench/gcs/syncer_fleet_vs_ray.py``, churn).  Here
a peer costs no task: the hub calls the peer's notify when its outbox stops being empty;
once per loop turn every such peer gets its queued entries, already encoded, as one gRPC
message, and the DATA frames for all streams of one connection (a fleet's raylets share one)
go out in one write.  A peer that does not read (its stream's window is spent, data queued) gets
nothing more written: its outbox keeps coalescing to the newest view per node, checked again
after ``_BLOCKED_RETRY_S``.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import structlog

from gcs.config import RequestLimits
from gcs.managers.sync_hub import GCS_SYNCER_NODE_ID, Peer, SyncHub
from gcs.rpc.errors import InvalidArgument
from gcs.rpc.front.grpc_wire import (
    OK_TRAILERS,
    RESPONSE_HEADERS,
    GrpcWireError,
    message_frame,
    metadata_block,
    request_metadata,
    split_messages,
    trailers_block,
    trailers_only,
)
from gcs.rpc.front.h2 import H2ServerConnection, Stream
from gcs.rpc.server import CallHook
from gcs.rpc.warnings import WarningSampler
from gcs.services.ray_syncer import (
    MAX_BATCH_MESSAGES,
    START_SYNC_PATH,
    decode_batch,
    node_id_from_metadata,
)

log = structlog.get_logger("gcs.syncer")

_BLOCKED_RETRY_S = 0.05
_HEADERS = RESPONSE_HEADERS + metadata_block((("node_id", GCS_SYNCER_NODE_ID),))


class SyncCall:
    """One raylet's stream (a stream's ``app`` state)."""

    __slots__ = ("body", "conn", "encoding", "ended", "peer", "scheduled", "start", "stream")

    def __init__(self, conn: H2ServerConnection, stream: Stream, encoding: bytes | None) -> None:
        self.conn = conn
        self.stream = stream
        self.encoding = encoding
        self.body = bytearray()
        self.peer: Peer | None = None
        self.scheduled = False
        self.ended = False
        self.start = time.perf_counter()


class SyncDispatcher:
    def __init__(
        self,
        hub: SyncHub,
        limits: RequestLimits,
        max_message_bytes: int,
        on_call: CallHook | None = None,
        warnings: WarningSampler | None = None,
    ) -> None:
        self._warnings = warnings
        self._hub = hub
        self._limits = limits
        self._max_message = max_message_bytes
        self._on_call = on_call
        self._pending: list[SyncCall] = []
        self._open: set[SyncCall] = set()

    def open(self, conn: H2ServerConnection, stream: Stream, encoding: bytes | None) -> SyncCall:
        call = SyncCall(conn, stream, encoding)
        try:
            node_id = node_id_from_metadata(request_metadata(stream.headers))
        except InvalidArgument as err:
            self._finish(call, grpc.StatusCode.INVALID_ARGUMENT, err.message)
            return call
        conn.send_headers(stream, _HEADERS)
        call.peer = self._hub.connect(node_id, lambda: self._schedule(call))
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
        peer = call.peer
        if peer is None or call.ended:
            conn.release(stream, len(data))
            return
        body = call.body
        body += data
        try:
            messages = split_messages(body, call.encoding, self._max_message)
            for raw, size in messages:
                conn.release(stream, size)
                for message in decode_batch(raw, self._limits):
                    self._hub.receive(peer, message)
        except InvalidArgument as err:
            fields = {"node_id": peer.node_id.hex(), "error": err.message}
            if self._warnings is not None:
                self._warnings.warn("syncer.bad_batch", **fields)
            else:
                log.warning("syncer.bad_batch", **fields)
            self._finish(call, grpc.StatusCode.INVALID_ARGUMENT, err.message)
        except GrpcWireError as err:
            self._finish(call, err.code, err.message)

    def on_end(self, conn: H2ServerConnection, stream: Stream, call: SyncCall) -> None:
        """The raylet is done writing: the stream ends (it reconnects if it wants more)."""
        self._finish(call, grpc.StatusCode.OK, "")

    def on_reset(self, call: SyncCall) -> None:
        self._finish(call, grpc.StatusCode.CANCELLED, "", send=False)

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
        peer = call.peer
        if peer is None or call.ended:
            return
        if peer.closed:  # replaced by a newer stream of the node, or the node died
            self._finish(call, grpc.StatusCode.OK, "")
            return
        conn, stream = call.conn, call.stream
        if conn.streams.get(stream.id) is not stream:  # the connection went away
            self._finish(call, grpc.StatusCode.CANCELLED, "", send=False)
            return
        if stream.out:  # the raylet is not reading: let its outbox coalesce meanwhile
            call.scheduled = True
            asyncio.get_running_loop().call_later(_BLOCKED_RETRY_S, self._retry, call)
            return
        entries = peer.drain(MAX_BATCH_MESSAGES)
        if entries:
            conn.send_data(stream, message_frame(b"".join(entries)))
        if len(peer):
            self._schedule(call)

    def _retry(self, call: SyncCall) -> None:
        call.scheduled = False
        self._schedule(call)

    def _finish(
        self, call: SyncCall, code: grpc.StatusCode, message: str, *, send: bool = True
    ) -> None:
        if call.ended:
            return
        call.ended = True
        self._open.discard(call)
        peer = call.peer
        if peer is not None:
            self._hub.disconnect(peer)
        if send:
            if peer is None:  # refused before the response headers
                call.conn.send_headers(call.stream, trailers_only(code, message), end_stream=True)
            elif code is grpc.StatusCode.OK:
                call.conn.send_trailers(call.stream, OK_TRAILERS)
            else:
                call.conn.send_trailers(call.stream, trailers_block(code, message))
        if self._on_call is not None:
            self._on_call(START_SYNC_PATH, code.name, time.perf_counter() - call.start)
