"""A tiny in-process GCS that records what clients send, for SDK and interop tests.

It serves ``NodeInfoGcsService.GetClusterId`` and two ``AutoscalerStateService`` methods on
Ray's method paths (others answer UNIMPLEMENTED), records every call (method, the request
bytes exactly as received, metadata) and answers with canned replies.  Real Ray clients
(``ray._raylet.GcsClient`` in another process) and our SDK can both talk to it, so a test can
compare their wire bytes.

    async with RecordingGcs() as gcs:
        ... gcs.address ...; gcs.calls_to("RequestClusterResourceConstraint")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from gcs.proto import autoscaler_pb2, gcs_service_pb2
from gcs.rpc import wire_service_name
from gcs.rpc.descriptors import AUTOSCALER_STATE, NODE_INFO

DEFAULT_CLUSTER_ID = bytes(range(1, 29))
"""28 bytes, like Ray's ClusterID."""


@dataclass(frozen=True)
class RecordedCall:
    method: str
    request: Any
    raw: bytes
    """The request exactly as it arrived (our deserialize -> serialize is not involved)."""
    metadata: tuple[tuple[str, str], ...]

    def metadata_value(self, key: str) -> str | None:
        return next((v for k, v in self.metadata if k == key), None)


@dataclass
class _Recorder:
    calls: list[RecordedCall] = field(default_factory=list)
    cluster_id: bytes = DEFAULT_CLUSTER_ID
    status_reply: autoscaler_pb2.GetClusterStatusReply = field(
        default_factory=autoscaler_pb2.GetClusterStatusReply
    )
    fail_with: dict[str, tuple[grpc.StatusCode, str]] = field(default_factory=dict)

    def reply_for(self, method: str) -> Any:
        if method == "GetClusterId":
            return gcs_service_pb2.GetClusterIdReply(cluster_id=self.cluster_id)
        if method == "GetClusterStatus":
            return self.status_reply
        return autoscaler_pb2.RequestClusterResourceConstraintReply()

    def handler(self, service: ServiceDescriptor, method: str) -> grpc.RpcMethodHandler:
        request_cls = GetMessageClass(service.methods_by_name[method].input_type)

        async def handle(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            metadata = tuple((m.key, m.value) for m in context.invocation_metadata() or ())
            request = request_cls.FromString(raw)
            self.calls.append(RecordedCall(method, request, raw, metadata))
            if method in self.fail_with:
                code, details = self.fail_with[method]
                await context.abort(code, details)
            return self.reply_for(method)

        return grpc.unary_unary_rpc_method_handler(
            handle,
            request_deserializer=None,  # keep the bytes exactly as they arrived
            response_serializer=lambda m: m.SerializeToString(),
        )

    def generic_handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        served = {
            NODE_INFO: ("GetClusterId",),
            AUTOSCALER_STATE: ("RequestClusterResourceConstraint", "GetClusterStatus"),
        }
        return tuple(
            grpc.method_handlers_generic_handler(
                wire_service_name(service), {m: self.handler(service, m) for m in methods}
            )
            for service, methods in served.items()
        )


class RecordingGcs:
    """Start with ``await gcs.start()`` (or ``async with``); ``address`` is ``127.0.0.1:port``."""

    def __init__(self, *, cluster_id: bytes = DEFAULT_CLUSTER_ID) -> None:
        self._rec = _Recorder(cluster_id=cluster_id)
        self._server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def cluster_id(self) -> bytes:
        return self._rec.cluster_id

    @property
    def calls(self) -> list[RecordedCall]:
        return list(self._rec.calls)

    def calls_to(self, method: str) -> list[RecordedCall]:
        return [c for c in self._rec.calls if c.method == method]

    def set_status_reply(self, reply: autoscaler_pb2.GetClusterStatusReply) -> None:
        self._rec.status_reply = reply

    def fail(self, method: str, code: grpc.StatusCode, details: str) -> None:
        """Make every later call of ``method`` abort with ``code`` / ``details``."""
        self._rec.fail_with[method] = (code, details)

    async def start(self) -> Self:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(self._rec.generic_handlers())
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
