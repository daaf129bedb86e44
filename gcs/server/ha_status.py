"""The HA status port (``ha.status_port``): gRPC health that every member answers.

The GCS port is the leader's alone (a standby binds nothing there), so a health check on it
cannot tell a standby from a dead process.  This small gRPC server, on a port of each
member's own, answers ``grpc.health.v1.Health``: SERVING while the member's term serves,
NOT_SERVING on a standby (for monitoring, and for probes that must reach standbys).

It also answers ``gcs ha handover`` (:data:`HANDOVER_METHOD`, JSON in and out): the leader
hands over to a standby (:mod:`gcs.server.ha_handover`); a standby refuses
FAILED_PRECONDITION.

The service ``liveness`` answers SERVING in both roles for as long as the process runs its
event loop: a Kubernetes liveness probe on it ends a stalled member (SIGSTOP, a hung loop)
within its bound, which closes the stalled ex-leader's connections so its clients reconnect
to the new leader (issue 29 item 5; ``deploy/kuberay/gcs-ha.yaml``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gcs.base.background import Background
from gcs.server.ha_handover import HandoverResult, NotLeader

__all__ = ["HANDOVER_METHOD", "LIVENESS_SERVICE", "HaStatusServer"]

HANDOVER_METHOD = "/gcs.ha.Admin/Handover"
"""Request ``{"to": holder or ""}``; reply :meth:`HandoverResult.as_dict` (JSON)."""
LIVENESS_SERVICE = "liveness"

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HaStatusServer:
    def __init__(self) -> None:
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._pending = Background("ha_status")
        self.port = 0
        self.handover: Callable[[str], Awaitable[HandoverResult]] | None = None
        """The member's :meth:`~gcs.server.ha.HaCoordinator.hand_over` (set once built)."""

    async def _handover(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        try:
            to = json.loads(request or b"{}").get("to", "")
            if not isinstance(to, str):
                raise TypeError
        except (ValueError, TypeError, AttributeError):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, 'request: {"to": "<holder>"}')
            raise AssertionError("unreachable") from None
        if self.handover is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not a running HA member")
            raise AssertionError("unreachable")
        try:
            result = await self.handover(to)
        except NotLeader as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            raise AssertionError("unreachable") from None
        return json.dumps(result.as_dict()).encode()

    async def start(self, host: str, port: int) -> int:
        """Bind and serve (NOT_SERVING until :meth:`set`); the bound port."""
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        admin = grpc.method_handlers_generic_handler(
            "gcs.ha.Admin", {"Handover": grpc.unary_unary_rpc_method_handler(self._handover)}
        )
        server.add_generic_rpc_handlers((admin,))
        bound = server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise OSError(f"cannot bind the HA status port {host}:{port} (in use?)")
        await server.start()
        self._server = server
        await self._health.set("", _NOT_SERVING)
        await self._health.set(LIVENESS_SERVICE, _SERVING)
        self.port = bound
        return bound

    def set(self, serving: bool) -> None:
        """From the coordinator (on the loop): the member's term serves, or not."""
        self._pending.spawn(self._health.set("", _SERVING if serving else _NOT_SERVING), "set")

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await self._health.enter_graceful_shutdown()
            await server.stop(0)
        await self._pending.close()
