"""``ray.rpc.syncer.RaySyncer/StartSync``: one bidi stream per raylet, onto the hub.

The raylet names itself in metadata ``node_id`` (hex); the GCS answers with initial
metadata ``node_id`` = 56 zeros (its syncer id, as Ray's GCS does).  Then both sides send
``RaySyncMessageBatch`` frames whenever they have something.  Reading and writing run
independently: a reader task feeds :meth:`SyncHub.receive`; this handler writes what the
peer's outbox holds.  Bad input ends the stream with INVALID_ARGUMENT naming the field (the
raylet reconnects after its back-off, like after any stream error).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError

from gcs.config import RequestLimits
from gcs.ids import NODE_ID_SIZE
from gcs.managers.sync_hub import GCS_SYNCER_NODE_ID, MESSAGE_TYPES, Peer, SyncHub
from gcs.proto import ray_syncer_pb2
from gcs.rpc.errors import InvalidArgument
from gcs.rpc.wire import method_path, wire_service_name

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


class RaySyncerServicer:
    def __init__(
        self,
        hub: SyncHub,
        *,
        limits: RequestLimits,
        on_call: CallHook | None = None,
    ) -> None:
        self._hub = hub
        self._limits = limits
        self._on_call = on_call

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
        start = time.perf_counter()
        code = "OK"
        try:
            node_id = node_id_from_metadata(context.invocation_metadata())
        except InvalidArgument as err:
            self._end(context, err, start)
            return
        await context.send_initial_metadata((("node_id", GCS_SYNCER_NODE_ID),))
        peer = self._hub.connect(node_id)
        failure: list[InvalidArgument] = []
        reader = asyncio.create_task(self._read(requests, peer, failure))
        try:
            while True:
                batch = await peer.take(MAX_BATCH_MESSAGES)
                if batch is None:
                    break
                yield b"".join(batch)  # entries: a serialized RaySyncMessageBatch
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        finally:
            reader.cancel()
            self._hub.disconnect(peer)
            log.debug("syncer.disconnected", node_id=node_id.hex())
            if failure:
                self._end(context, failure[0], start)
            elif self._on_call is not None:
                self._on_call(START_SYNC_PATH, code, time.perf_counter() - start)

    async def _read(
        self, requests: AsyncIterator[bytes], peer: Peer, failure: list[InvalidArgument]
    ) -> None:
        hub, limits = self._hub, self._limits
        try:
            async for raw in requests:
                for message in decode_batch(raw, limits):
                    hub.receive(peer, message)
        except InvalidArgument as err:
            log.warning("syncer.bad_batch", node_id=peer.node_id.hex(), error=err.message)
            failure.append(err)
        except (grpc.aio.AioRpcError, ConnectionError) as err:
            log.debug("syncer.read_ended", node_id=peer.node_id.hex(), error=repr(err))
        except Exception:  # a bug of ours: end this stream (the raylet reconnects), say why
            log.exception("syncer.read_failed", node_id=peer.node_id.hex())
        finally:
            peer.close()  # the writer ends too (the stream is over either way)

    def _end(self, context: grpc.aio.ServicerContext, err: InvalidArgument, start: float) -> None:
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
        context.set_details(err.message)
        if self._on_call is not None:
            self._on_call(START_SYNC_PATH, "INVALID_ARGUMENT", time.perf_counter() - start)
