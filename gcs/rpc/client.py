"""Client stubs built from service descriptors, calling Ray's method paths.

``stub = ServiceStub(channel, NODE_INFO)``; ``await stub.GetClusterId(req, timeout=5)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message_factory import GetMessageClass

from gcs.rpc.method_paths import method_path

DEFAULT_TIMEOUT_S = 30.0


class ServiceStub:
    """Attribute per RPC; each is a ``grpc.aio`` unary-unary multicallable.

    ``metadata`` (e.g. the ``ray_cluster_id``) is sent with every call and ``timeout_s`` is
    applied when the caller gives none: timeouts are on by default.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        service: ServiceDescriptor,
        *,
        metadata: Sequence[tuple[str, str]] = (),
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._service = service
        self._metadata = tuple(metadata)
        self._timeout_s = timeout_s
        self._calls: dict[str, Any] = {}
        for method in service.methods:
            if method.client_streaming or method.server_streaming:
                continue
            reply_cls = GetMessageClass(method.output_type)
            self._calls[method.name] = channel.unary_unary(
                method_path(method),
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=reply_cls.FromString,
            )

    def set_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)

    def __getattr__(self, name: str) -> Any:
        try:
            call = self._calls[name]
        except KeyError:
            raise AttributeError(f"{self._service.full_name} has no method {name}") from None

        def invoke(request: Any, *, timeout: float | None = None, metadata: Any = None) -> Any:
            md = self._metadata + tuple(metadata or ())
            return call(
                request,
                timeout=self._timeout_s if timeout is None else timeout,
                metadata=md or None,
            )

        return invoke
