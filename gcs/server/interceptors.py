"""Server interceptor: the ``ray_cluster_id`` metadata check (gcs-server.md §1).

Absent metadata is accepted (first ``GetClusterId``); present and different -> UNAUTHENTICATED
with Ray's message, for every RPC.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

WRONG_CLUSTER_ID = "WrongClusterID: Perhaps the client is accessing GCS after it has restarted."


class ClusterIdInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, cluster_id_hex: str) -> None:
        self._expected = cluster_id_hex

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "ray_cluster_id":
                text = value.decode() if isinstance(value, bytes) else value
                if text.lower() != self._expected:
                    return _reject()
                break
        return await continuation(handler_call_details)


def _reject() -> grpc.RpcMethodHandler:
    async def abort(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, WRONG_CLUSTER_ID)

    return grpc.unary_unary_rpc_method_handler(abort)
