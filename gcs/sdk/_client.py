"""Async and sync GCS clients that handshake like Ray's ``GcsClient``.

On connect they call ``NodeInfoGcsService.GetClusterId`` *without* metadata, then send
``ray_cluster_id`` = hex of that id as metadata on every later call (what Ray's C++ client
does, and what a GCS checks).  Failed calls raise :class:`gcs.sdk.RpcError` carrying the
gRPC status code.
"""

from __future__ import annotations

from typing import Any, Self

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from gcs.base.auth import AuthConfigError
from gcs.proto import gcs_service_pb2
from gcs.rpc import ServiceStub, method_path
from gcs.rpc.descriptors import NODE_INFO
from gcs.rpc.security import Security
from gcs.sdk._errors import GcsSdkError, RpcError

DEFAULT_TIMEOUT_S = 30.0
CLUSTER_ID_METADATA = "ray_cluster_id"


def _path(service: ServiceDescriptor, method: str) -> str:
    return method_path(service.methods_by_name[method])


def _cluster_id_from(reply: gcs_service_pb2.GetClusterIdReply) -> bytes:
    if reply.status.code != 0:
        raise GcsSdkError(
            f"GetClusterId answered status {reply.status.code}: {reply.status.message}"
        )
    return reply.cluster_id


def _security(given: Security | None) -> Security:
    """``given``, else Ray's environment (``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN*``/``RAY_USE_TLS``)."""
    if given is not None:
        return given
    try:
        return Security.from_env()
    except AuthConfigError as err:
        raise GcsSdkError(str(err)) from None


class _StubCache:
    """One stub per service, built with the cluster-id metadata once the handshake is done.

    ServiceStub only calls ``channel.unary_unary``, which sync channels have too, so the sync
    and async clients share this.
    """

    _channel: Any
    _stubs: dict[str, ServiceStub]
    _metadata: tuple[tuple[str, str], ...]
    timeout_s: float
    _CONNECT_HINT = "call connect()"

    def _stub(self, service: ServiceDescriptor) -> ServiceStub:
        if self._channel is None:
            raise GcsSdkError(f"client is not connected: {self._CONNECT_HINT}")
        stub = self._stubs.get(service.full_name)
        if stub is None:
            stub = ServiceStub(
                self._channel, service, metadata=self._metadata, timeout_s=self.timeout_s
            )
            self._stubs[service.full_name] = stub
        return stub


class AsyncGcsClient(_StubCache):
    """Use as ``async with AsyncGcsClient(addr) as c: await c.call(SERVICE, "Method", req)``."""

    _CONNECT_HINT = "call connect() or use 'async with'"

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        security: Security | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._security = security
        self._channel: grpc.aio.Channel | None = None
        self._stubs: dict[str, ServiceStub] = {}
        self._metadata: tuple[tuple[str, str], ...] = ()
        self.cluster_id: bytes | None = None

    async def connect(self) -> Self:
        if self._channel is not None:
            return self
        self._channel = _security(self._security).aio_channel(self.address)
        try:
            reply = await self._invoke(
                NODE_INFO, "GetClusterId", gcs_service_pb2.GetClusterIdRequest()
            )
            self.cluster_id = _cluster_id_from(reply)
        except BaseException:
            await self.close()
            raise
        self._metadata = ((CLUSTER_ID_METADATA, self.cluster_id.hex()),)
        self._stubs.clear()  # stubs built before the handshake carry no metadata
        return self

    async def _invoke(
        self, service: ServiceDescriptor, method: str, request: Any, timeout_s: float | None = None
    ) -> Any:
        try:
            return await getattr(self._stub(service), method)(request, timeout=timeout_s)
        except grpc.RpcError as err:
            raise RpcError.from_grpc(_path(service, method), err) from err

    async def call(
        self,
        service: ServiceDescriptor,
        method: str,
        request: Any,
        *,
        timeout_s: float | None = None,
    ) -> Any:
        """Call ``method`` of ``service`` (connecting first if needed) and return the reply."""
        await self.connect()
        return await self._invoke(service, method, request, timeout_s)

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        self._stubs.clear()
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class GcsClient(_StubCache):
    """Blocking twin of :class:`AsyncGcsClient` on a plain ``grpc`` channel (no event loop)."""

    _CONNECT_HINT = "call connect() or use 'with'"

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        security: Security | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._security = security
        self._channel: grpc.Channel | None = None
        self._stubs: dict[str, ServiceStub] = {}
        self._metadata: tuple[tuple[str, str], ...] = ()
        self.cluster_id: bytes | None = None

    def connect(self) -> Self:
        if self._channel is not None:
            return self
        self._channel = _security(self._security).channel(self.address)
        try:
            reply = self._invoke(NODE_INFO, "GetClusterId", gcs_service_pb2.GetClusterIdRequest())
            self.cluster_id = _cluster_id_from(reply)
        except BaseException:
            self.close()
            raise
        self._metadata = ((CLUSTER_ID_METADATA, self.cluster_id.hex()),)
        self._stubs.clear()
        return self

    def _invoke(
        self, service: ServiceDescriptor, method: str, request: Any, timeout_s: float | None = None
    ) -> Any:
        try:
            return getattr(self._stub(service), method)(request, timeout=timeout_s)
        except grpc.RpcError as err:
            raise RpcError.from_grpc(_path(service, method), err) from err

    def call(
        self,
        service: ServiceDescriptor,
        method: str,
        request: Any,
        *,
        timeout_s: float | None = None,
    ) -> Any:
        self.connect()
        return self._invoke(service, method, request, timeout_s)

    def close(self) -> None:
        channel, self._channel = self._channel, None
        self._stubs.clear()
        if channel is not None:
            channel.close()

    def __enter__(self) -> Self:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()
