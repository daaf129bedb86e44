"""``ray.rpc.syncer.RaySyncer/StartSync``: one bidi stream per raylet, onto the hub.

The raylet names itself in metadata ``node_id`` (hex); the GCS answers with initial
metadata ``node_id`` = 56 zeros (its syncer id, as Ray's GCS does).  Then both sides send
``RaySyncMessageBatch`` frames whenever they have something.  Bad input ends the stream with
INVALID_ARGUMENT naming the field (the raylet reconnects after its back-off, like after any
stream error).

The behaviour is written once, in :class:`StartSync` (admit the raylet, take its batches
into the hub, hand out its outbox, end once with a status and one call record); the
transports adapt it: the front server on the GCS port (:mod:`gcs.front.sync`, no task
per peer) and grpc.aio (:class:`RaySyncerServicer`, for ``front_server: false``), where a
reader task feeds :meth:`StartSync.receive` while the handler writes what the outbox holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError

from gcs.base.background import Background
from gcs.base.ids import NODE_ID_SIZE
from gcs.config import RequestLimits
from gcs.managers.sync_hub import GCS_SYNCER_NODE_ID, MESSAGE_TYPES, Peer, SyncHub
from gcs.proto import ray_syncer_pb2
from gcs.rpc.errors import InvalidArgument
from gcs.rpc.method_paths import method_path, wire_service_name
from gcs.rpc.warnings import WarningSampler

log = structlog.get_logger("gcs.syncer")

SERVICE = ray_syncer_pb2.DESCRIPTOR.services_by_name["RaySyncer"]
START_SYNC_PATH = method_path(SERVICE.methods_by_name["StartSync"])
MAX_BATCH_MESSAGES = 1000
"""Messages per outgoing frame (Ray sends one per frame by default; more is the same wire)."""

CallHook = Callable[[str, str, float], None]


def node_id_from_metadata(metadata: Any) -> bytes:
    for key, value in metadata or ():
        if key == "node_id":
            text = value.decode() if isinstance(value, bytes) else value
            try:
                node_id = bytes.fromhex(text)
            except ValueError:
                raise InvalidArgument(f"metadata node_id is not hex: {text[:80]!r}") from None
            if len(node_id) != NODE_ID_SIZE:
                raise InvalidArgument(
                    f"metadata node_id has {len(node_id)} bytes, expected {NODE_ID_SIZE}"
                )
            return node_id
    raise InvalidArgument("metadata node_id is missing (the raylet's hex node id)")


def decode_batch(raw: bytes, limits: RequestLimits) -> list[ray_syncer_pb2.RaySyncMessage]:
    if len(raw) > limits.max_request_bytes:
        raise InvalidArgument(
            f"RaySyncMessageBatch is {len(raw)} bytes; limited to {limits.max_request_bytes}"
        )
    try:
        batch = ray_syncer_pb2.RaySyncMessageBatch.FromString(raw)
    except DecodeError as exc:
        raise InvalidArgument(f"request is not a valid RaySyncMessageBatch: {exc}") from None
    if len(batch.messages) > limits.max_repeated_entries:
        raise InvalidArgument(
            f"messages has {len(batch.messages)} entries; at most "
            f"{limits.max_repeated_entries} per batch"
        )
    for i, message in enumerate(batch.messages):
        if len(message.node_id) != NODE_ID_SIZE:
            raise InvalidArgument(
                f"messages[{i}].node_id has {len(message.node_id)} bytes, expected {NODE_ID_SIZE}"
            )
        if message.message_type not in MESSAGE_TYPES:
            raise InvalidArgument(
                f"messages[{i}].message_type {message.message_type} is not RESOURCE_VIEW or "
                "COMMANDS"
            )
    return list(batch.messages)


class SyncSession:
    """One raylet's stream, whatever carries it."""

    __slots__ = ("ended", "peer", "start")

    def __init__(self, peer: Peer, start: float) -> None:
        self.peer = peer
        self.start = start
        self.ended = False


@dataclass(frozen=True, slots=True)
class StartSync:
    """``StartSync``'s behaviour, for every transport."""

    hub: SyncHub
    limits: RequestLimits
    on_call: CallHook | None = None
    warnings: WarningSampler | None = None

    def open(self, metadata: Any, notify: Callable[[], None] | None = None) -> SyncSession:
        """Admit the raylet named in ``metadata`` (its peer replaces an older stream of the
        node); ``notify``: called when its outbox stops being empty and when it closes.
        Refused: InvalidArgument (the call recorded); the transport answers it as the
        stream's status, before any response headers."""
        start = time.perf_counter()
        try:
            node_id = node_id_from_metadata(metadata)
        except InvalidArgument:
            self._record("INVALID_ARGUMENT", start)
            raise
        return SyncSession(self.hub.connect(node_id, notify), start)

    def receive(self, session: SyncSession, raw: bytes) -> None:
        """One ``RaySyncMessageBatch`` from the raylet into the hub.  A bad one raises
        InvalidArgument naming the field (logged): the transport ends the stream with it."""
        peer = session.peer
        if session.ended:
            return
        try:
            for message in decode_batch(raw, self.limits):
                self.hub.receive(peer, message)
        except InvalidArgument as err:
            fields = {"node_id": peer.node_id.hex(), "error": err.message}
            if self.warnings is not None:
                self.warnings.warn("syncer.bad_batch", **fields)
            else:
                log.warning("syncer.bad_batch", **fields)
            raise

    @staticmethod
    def outgoing_entries(session: SyncSession) -> list[bytes]:
        """What the raylet is to get now, as the entries of one ``RaySyncMessageBatch``
        (joined, they are its serialization); empty: nothing queued."""
        return session.peer.drain(MAX_BATCH_MESSAGES)

    def finish(self, session: SyncSession, code: grpc.StatusCode) -> bool:
        """The stream ended with ``code``: disconnect the peer, record the call; True the
        first time (the transport then sends the status), False after."""
        if session.ended:
            return False
        session.ended = True
        self.hub.disconnect(session.peer)
        log.debug("syncer.disconnected", node_id=session.peer.node_id.hex())
        self._record(code.name, session.start)
        return True

    def _record(self, code: str, start: float) -> None:
        if self.on_call is not None:
            self.on_call(START_SYNC_PATH, code, time.perf_counter() - start)


class RaySyncerServicer:
    """The grpc.aio transport of :class:`StartSync`."""

    def __init__(self, sync: StartSync, background: Background | None = None) -> None:
        self._sync = sync
        self._background = background if background is not None else Background("ray-syncer")

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self.start_sync,
            request_deserializer=None,  # raw bytes: decoded (and bounded) in the reader
            response_serializer=None,
        )
        return grpc.method_handlers_generic_handler(
            wire_service_name(SERVICE), {"StartSync": method}
        )

    async def start_sync(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        sync = self._sync
        try:
            session = sync.open(context.invocation_metadata())
        except InvalidArgument as err:
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details(err.message)
            return
        await context.send_initial_metadata((("node_id", GCS_SYNCER_NODE_ID),))
        failure: list[InvalidArgument] = []
        reader = self._background.spawn(self._read(requests, session, failure), "reader")
        code = grpc.StatusCode.OK
        try:
            while True:
                batch = await session.peer.take(MAX_BATCH_MESSAGES)
                if batch is None:
                    break
                yield b"".join(batch)  # entries: a serialized RaySyncMessageBatch
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        finally:
            if reader is not None:
                reader.cancel()
            if failure:
                code = grpc.StatusCode.INVALID_ARGUMENT
                context.set_code(code)
                context.set_details(failure[0].message)
            sync.finish(session, code)

    async def _read(
        self, requests: AsyncIterator[bytes], session: SyncSession, failure: list[InvalidArgument]
    ) -> None:
        sync, node = self._sync, session.peer.node_id.hex()
        try:
            async for raw in requests:
                sync.receive(session, raw)
        except InvalidArgument as err:  # logged by receive
            failure.append(err)
        except (grpc.aio.AioRpcError, ConnectionError) as err:
            log.debug("syncer.read_ended", node_id=node, error=repr(err))
        except Exception:  # a bug of ours: end this stream (the raylet reconnects), say why
            log.exception("syncer.read_failed", node_id=node)
        finally:
            session.peer.close()  # the writer ends too (the stream is over either way)
