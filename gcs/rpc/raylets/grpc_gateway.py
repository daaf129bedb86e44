"""The network :class:`~gcs.rpc.raylets.gateway.RayletGateway`: gRPC plus the lean HTTP/2 client.

* Bounded: at most ``max_in_flight`` background calls (polls, health checks, restart
  notifications) at once, and at most ``max_open_clients`` raylet clients open (least
  recently used idle ones are closed).  A call's deadline starts when it gets its slot.
  DrainRaylet / Resize answer a user and skip the queue (they still use the pool).
* Transport choice: GetResourceLoad goes over :mod:`gcs.rpc.raylets.h2_unary` when the poll
  transport is ``h2``; a raylet the lean client cannot talk to (a protocol error, an
  unimplemented path, an oversized reply) is polled with grpc.aio from then on.
* Errors leave as domain errors (:mod:`gcs.rpc.raylets.errors`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import grpc
import structlog
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from gcs.proto import gcs_pb2, node_manager_pb2
from gcs.rpc.raylets.budget import RayletIoBudget
from gcs.rpc.raylets.errors import raylet_error
from gcs.rpc.raylets.h2_unary import H2CallError
from gcs.rpc.raylets.pool import RayletClientPool

log = structlog.get_logger("gcs.raylets")

H2_FALLBACK_CODES = frozenset(
    {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)
_LOAD_REQUEST = node_manager_pb2.GetResourceLoadRequest()
_NOTIFY_REQUEST = node_manager_pb2.NotifyGCSRestartRequest()
_SERVING = health_pb2.HealthCheckResponse.SERVING
_LoadReply = node_manager_pb2.GetResourceLoadReply


class GrpcRayletGateway:
    def __init__(self, budget: RayletIoBudget, *, poll_transport: str = "h2") -> None:
        if poll_transport not in ("grpc", "h2"):
            raise ValueError(f"poll transport must be 'grpc' or 'h2', not {poll_transport!r}")
        self.budget = budget
        self.pool = RayletClientPool(budget.max_open_clients)
        self._slots = asyncio.Semaphore(budget.max_in_flight)
        self._h2 = poll_transport == "h2"
        self.grpc_only: set[bytes] = set()
        """Nodes whose raylet the lean HTTP/2 client could not talk to: polled with grpc."""
        self.in_flight = 0
        self.max_in_flight_seen = 0

    # ------------------------------------------------------------------ RayletGateway

    async def get_resource_load(
        self, node_id: bytes, address: str, timeout_s: float
    ) -> gcs_pb2.ResourcesData:
        async with self._slots:
            self._enter()
            client = self.pool.lease(node_id, address)
            try:
                if self._h2 and node_id not in self.grpc_only:
                    raw = await client.h2_load().call(b"", timeout_s)
                    try:
                        reply = _LoadReply.FromString(raw)
                    except DecodeError:
                        raise H2CallError(grpc.StatusCode.INTERNAL, "undecodable reply") from None
                else:
                    reply = await client.node_manager.GetResourceLoad(
                        _LOAD_REQUEST, timeout=timeout_s
                    )
            except H2CallError as err:
                if err.code() in H2_FALLBACK_CODES:
                    self._fall_back(node_id, err)
                raise raylet_error(node_id, "GetResourceLoad", err) from None
            except grpc.aio.AioRpcError as err:
                raise raylet_error(node_id, "GetResourceLoad", err) from None
            finally:
                self.pool.release(client)
                self.in_flight -= 1
        return reply.resources

    async def health_check(self, node_id: bytes, address: str, timeout_s: float) -> bool:
        async with self._slots:
            self._enter()
            client = self.pool.lease(node_id, address)
            try:
                reply = await client.health.Check(
                    health_pb2.HealthCheckRequest(service=node_id.hex()), timeout=timeout_s
                )
            except grpc.aio.AioRpcError as err:
                raise raylet_error(node_id, "HealthCheck", err) from None
            finally:
                self.pool.release(client)
                self.in_flight -= 1
        return bool(reply.status == _SERVING)

    async def notify_gcs_restart(self, node_id: bytes, address: str, timeout_s: float) -> None:
        async with self._slots:
            self._enter()
            client = self.pool.lease(node_id, address)
            try:
                await client.node_manager.NotifyGCSRestart(_NOTIFY_REQUEST, timeout=timeout_s)
            except grpc.aio.AioRpcError as err:
                raise raylet_error(node_id, "NotifyGCSRestart", err) from None
            finally:
                self.pool.release(client)
                self.in_flight -= 1

    async def drain(
        self,
        node_id: bytes,
        address: str,
        request: node_manager_pb2.DrainRayletRequest,
        timeout_s: float,
    ) -> node_manager_pb2.DrainRayletReply:
        client = self.pool.lease(node_id, address)
        try:
            reply: node_manager_pb2.DrainRayletReply = await client.node_manager.DrainRaylet(
                request, timeout=timeout_s
            )
        except grpc.aio.AioRpcError as err:
            raise raylet_error(node_id, "DrainRaylet", err) from err
        finally:
            self.pool.release(client)
        return reply

    async def resize(
        self, node_id: bytes, address: str, resources: Mapping[str, float], timeout_s: float
    ) -> dict[str, float]:
        client = self.pool.lease(node_id, address)
        try:
            reply = await client.node_manager.ResizeLocalResourceInstances(
                node_manager_pb2.ResizeLocalResourceInstancesRequest(resources=resources),
                timeout=timeout_s,
            )
        except grpc.aio.AioRpcError as err:
            raise raylet_error(node_id, "ResizeLocalResourceInstances", err) from err
        finally:
            self.pool.release(client)
        return dict(reply.total_resources)

    def forget(self, node_id: bytes) -> None:
        self.pool.drop(node_id)
        self.grpc_only.discard(node_id)

    async def close(self) -> None:
        await self.pool.close()

    # ------------------------------------------------------------------ internals

    def _enter(self) -> None:
        self.in_flight += 1
        self.max_in_flight_seen = max(self.max_in_flight_seen, self.in_flight)

    def _fall_back(self, node_id: bytes, err: H2CallError) -> None:
        """The peer speaks something our lean client does not: use grpc from now on."""
        self.grpc_only.add(node_id)
        log.warning(
            "raylet.h2_fallback", node_id=node_id.hex(), code=err.code().name, details=err.details
        )
