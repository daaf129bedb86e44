"""The one server interceptor: Ray's token check and the ``ray_cluster_id`` check.

* Token (``RAY_AUTH_MODE=token``): every RPC must carry ``authorization: Bearer <token>``
  (constant-time comparison) or gets UNAUTHENTICATED -- unary calls, pubsub long polls,
  reflection.  ``grpc.health.v1.Health`` is exempt, as in Ray: Ray 2.60's own ``gcs_server``
  in token mode answers ``Health/Check`` without a token (observed) while refusing
  ``GetClusterId``; liveness probes (kubelet gRPC probes, load balancers) carry no
  credentials and the answer reveals nothing.
* Cluster id (Ray's ``ray_cluster_id`` metadata): absent metadata is accepted (first
  ``GetClusterId``); present and different -> UNAUTHENTICATED with Ray's message.

Both checks share one pass over the metadata: a second interceptor would cost a second
coroutine per RPC.  The same class guards the raylet agent's server (no cluster id there).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from gcs.base.auth import AUTHORIZATION_METADATA, UNAUTHENTICATED_MESSAGE, AuthToken

WRONG_CLUSTER_ID = "WrongClusterID: Perhaps the client is accessing GCS after it has restarted."
NOT_LEADER_MESSAGE = "this GCS is no longer the leader (HA): reconnect to reach the new one"
CLUSTER_ID_METADATA = "ray_cluster_id"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
_STREAMING_PREFIXES = (
    "/grpc.reflection.",
    "/grpc.health.v1.Health/Watch",
    "/ray.rpc.syncer.RaySyncer/",
)


class CallGuard:
    """The checks themselves, shared by the interceptor and the front server
    (:mod:`gcs.front`), which serves the pubsub methods without grpc.aio."""

    def __init__(self, cluster_id_hex: str | None = None, token: AuthToken | None = None) -> None:
        self.cluster = cluster_id_hex.lower() if cluster_id_hex else None
        self.token = token

    def refusal(
        self, method: str, authorization: str | bytes | None, cluster_id: str | bytes | None
    ) -> str | None:
        """None if the call may proceed, else the UNAUTHENTICATED message.  ``authorization``
        and ``cluster_id`` are the metadata values (None when absent)."""
        token = self.token
        if (
            token is not None
            and (authorization is None or not token.matches(authorization))
            and not method.startswith(HEALTH_PREFIX)
        ):
            return UNAUTHENTICATED_MESSAGE
        if cluster_id is not None and self.cluster is not None:
            text = cluster_id.decode() if isinstance(cluster_id, bytes) else cluster_id
            if text.lower() != self.cluster:
                return WRONG_CLUSTER_ID
        return None


class CallGuardInterceptor(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        cluster_id_hex: str | None = None,
        token: AuthToken | None = None,
        *,
        admit: Callable[[], bool] | None = None,
    ) -> None:
        """``admit`` (``--ha``): False once this GCS may no longer be the leader; its calls
        are then refused UNAVAILABLE, never answered from stale state."""
        self.guard = CallGuard(cluster_id_hex, token)
        self._admit = admit
        self._not_leader = _reject(
            NOT_LEADER_MESSAGE, streaming=False, code=grpc.StatusCode.UNAVAILABLE
        )
        self._not_leader_stream = _reject(
            NOT_LEADER_MESSAGE, streaming=True, code=grpc.StatusCode.UNAVAILABLE
        )
        self._wrong_cluster = _reject(WRONG_CLUSTER_ID, streaming=False)
        self._wrong_cluster_stream = _reject(WRONG_CLUSTER_ID, streaming=True)
        self._unauthenticated = _reject(UNAUTHENTICATED_MESSAGE, streaming=False)
        self._unauthenticated_stream = _reject(UNAUTHENTICATED_MESSAGE, streaming=True)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        authorization = cluster_id = None
        for key, value in handler_call_details.invocation_metadata or ():  # type: ignore[attr-defined]
            if key == AUTHORIZATION_METADATA:
                authorization = value
            elif key == CLUSTER_ID_METADATA:
                cluster_id = value
        method = handler_call_details.method  # type: ignore[attr-defined]
        if self._admit is not None and not self._admit():
            streaming = method.startswith(_STREAMING_PREFIXES)
            return self._not_leader_stream if streaming else self._not_leader
        refusal = self.guard.refusal(method, authorization, cluster_id)
        if refusal is None:
            return await continuation(handler_call_details)
        streaming = method.startswith(_STREAMING_PREFIXES)
        if refusal is WRONG_CLUSTER_ID:
            return self._wrong_cluster_stream if streaming else self._wrong_cluster
        return self._unauthenticated_stream if streaming else self._unauthenticated


def _reject(
    message: str,
    *,
    streaming: bool,
    code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED,
) -> grpc.RpcMethodHandler:
    if streaming:

        async def abort_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(code, message)
            yield  # pragma: no cover - abort raises

        return grpc.stream_stream_rpc_method_handler(abort_stream)

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        # set the status and return (not context.abort: its exception keeps a reference
        # cycle that holds the request until a full GC; see gcs/rpc/server.py)
        context.set_code(code)
        context.set_details(message)
        return b""

    return grpc.unary_unary_rpc_method_handler(refuse)
