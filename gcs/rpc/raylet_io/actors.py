"""The I/O the GCS actor scheduler does: lease a worker, push the creation task, kill.

:class:`ActorGateway` is what the actor manager and scheduler see (no transport types);
:class:`GrpcActorGateway` implements it over the raylet gateway's transport (the lean HTTP/2
client, or grpc.aio with TLS or after a fallback):

* ``NodeManagerService.RequestWorkerLease`` / ``KillLocalActor`` go to the raylet through the
  raylet client pool the load poller uses (one connection per raylet);
* ``CoreWorkerService.PushTask`` goes to the leased core worker, one connection per worker
  address, closed when the worker is forgotten (the actor died or moved).

Errors leave as domain errors: :class:`~gcs.base.errors.RayletUnreachable` /
:class:`~gcs.base.errors.RayStatusError` for raylets (:mod:`gcs.rpc.raylet_io.errors`),
:class:`~gcs.base.errors.WorkerUnreachable` for core workers.
"""

from __future__ import annotations

from typing import Protocol

import grpc
from google.protobuf.message import DecodeError, Message

from gcs.base.background import Background
from gcs.base.errors import WorkerUnreachable
from gcs.proto import common_pb2, core_worker_pb2, node_manager_pb2
from gcs.rpc.descriptors import CORE_WORKER
from gcs.rpc.method_paths import method_path
from gcs.rpc.raylet_io.grpc_gateway import GrpcRayletGateway
from gcs.rpc.raylet_io.h2_grpc import H2CallError
from gcs.rpc.raylet_io.h2_unary import H2UnaryClient
from gcs.rpc.raylet_io.pool import CHANNEL_OPTIONS, RayletClientPool, direct_call
from gcs.rpc.security import NO_SECURITY, Security

__all__ = ["ActorGateway", "GrpcActorGateway", "worker_address"]

_PUSH_TASK_PATH = method_path(CORE_WORKER.methods_by_name["PushTask"])


def worker_address(address: common_pb2.Address) -> str:
    return f"{address.ip_address}:{address.port}"


class ActorGateway(Protocol):
    async def request_worker_lease(
        self,
        node_id: bytes,
        address: str,
        request: node_manager_pb2.RequestWorkerLeaseRequest,
        timeout_s: float | None,
    ) -> node_manager_pb2.RequestWorkerLeaseReply:
        """``RequestWorkerLease`` on raylet ``node_id`` at ``address`` (``host:port``).

        The raylet answers when a worker is leased, or with a spillback / rejection /
        cancellation; ``timeout_s`` None waits as long as the raylet queues it."""
        ...

    async def push_task(
        self, worker: common_pb2.Address, request: core_worker_pb2.PushTaskRequest
    ) -> core_worker_pb2.PushTaskReply:
        """``CoreWorkerService.PushTask`` to the leased worker; answers when the creation
        task (the actor's constructor) ran.  Raises WorkerUnreachable if the worker is gone."""
        ...

    async def kill_local_actor(
        self,
        node_id: bytes,
        address: str,
        request: node_manager_pb2.KillLocalActorRequest,
        timeout_s: float,
    ) -> None:
        """``KillLocalActor`` on the raylet hosting the actor's worker."""
        ...

    async def cancel_worker_lease(
        self, node_id: bytes, address: str, lease_id: bytes, timeout_s: float
    ) -> None:
        """``CancelWorkerLease``: withdraw a lease still queued at the raylet."""
        ...

    async def release_unused_actor_workers(
        self, node_id: bytes, address: str, in_use: list[bytes], timeout_s: float
    ) -> None:
        """``ReleaseUnusedActorWorkers``: after a GCS restart, the raylet frees the workers
        it leased for actors that are not in ``in_use`` (worker ids)."""
        ...

    def forget_worker(self, worker: common_pb2.Address) -> None:
        """Close the connection to a worker that no longer hosts an actor."""
        ...

    async def close(self) -> None: ...


class GrpcActorGateway:
    def __init__(
        self,
        raylets: RayletClientPool,
        *,
        security: Security = NO_SECURITY,
        gateway: GrpcRayletGateway | None = None,
    ) -> None:
        """``gateway``: the raylet gateway owning ``raylets``; given, raylet calls go over its
        transport (the lean HTTP/2 client unless TLS or a fallback says grpc) and so does
        PushTask when it is lean: grpc.aio costs ~0.3-0.5 ms of CPU per call, and a channel
        per actor's worker more."""
        self._raylets = raylets
        self._security = security
        self._gateway = gateway
        self._lean = gateway is not None and gateway.lean
        self._workers: dict[str, grpc.aio.Channel] = {}
        self._lean_workers: dict[str, H2UnaryClient] = {}
        self._closing = Background("worker_channels")
        """Forgotten workers' channels, closing."""

    async def request_worker_lease(
        self,
        node_id: bytes,
        address: str,
        request: node_manager_pb2.RequestWorkerLeaseRequest,
        timeout_s: float | None,
    ) -> node_manager_pb2.RequestWorkerLeaseReply:
        reply: node_manager_pb2.RequestWorkerLeaseReply = await self._raylet_call(
            node_id, address, "RequestWorkerLease", request, timeout_s
        )
        return reply

    async def kill_local_actor(
        self,
        node_id: bytes,
        address: str,
        request: node_manager_pb2.KillLocalActorRequest,
        timeout_s: float,
    ) -> None:
        await self._raylet_call(node_id, address, "KillLocalActor", request, timeout_s)

    async def release_unused_actor_workers(
        self, node_id: bytes, address: str, in_use: list[bytes], timeout_s: float
    ) -> None:
        request = node_manager_pb2.ReleaseUnusedActorWorkersRequest(worker_ids_in_use=in_use)
        await self._raylet_call(node_id, address, "ReleaseUnusedActorWorkers", request, timeout_s)

    async def cancel_worker_lease(
        self, node_id: bytes, address: str, lease_id: bytes, timeout_s: float
    ) -> None:
        request = node_manager_pb2.CancelWorkerLeaseRequest(lease_id=lease_id)
        await self._raylet_call(node_id, address, "CancelWorkerLease", request, timeout_s)

    async def _raylet_call(
        self, node_id: bytes, address: str, method: str, request: Message, timeout_s: float | None
    ) -> Message:
        if self._gateway is not None:
            return await self._gateway.control_call(node_id, address, method, request, timeout_s)
        return await direct_call(self._raylets, node_id, address, method, request, timeout_s)

    async def push_task(
        self, worker: common_pb2.Address, request: core_worker_pb2.PushTaskRequest
    ) -> core_worker_pb2.PushTaskReply:
        if self._lean:
            return await self._lean_push_task(worker, request)
        target = worker_address(worker)
        channel = self._workers.get(target)
        if channel is None:
            channel = self._security.aio_channel(target, options=CHANNEL_OPTIONS)
            self._workers[target] = channel
        call = channel.unary_unary(
            _PUSH_TASK_PATH,
            request_serializer=core_worker_pb2.PushTaskRequest.SerializeToString,
            response_deserializer=core_worker_pb2.PushTaskReply.FromString,
            _registered_method=True,
        )
        try:
            reply: core_worker_pb2.PushTaskReply = await call(request)
        except grpc.aio.AioRpcError as err:
            self.forget_worker(worker)
            detail = err.details() or err.code().name
            raise WorkerUnreachable(
                worker.worker_id, f"worker {worker.worker_id.hex()} at {target} PushTask: {detail}"
            ) from None
        return reply

    async def _lean_push_task(
        self, worker: common_pb2.Address, request: core_worker_pb2.PushTaskRequest
    ) -> core_worker_pb2.PushTaskReply:
        target = worker_address(worker)
        client = self._lean_workers.get(target)
        if client is None:
            token = self._security.token
            client = H2UnaryClient(
                target,
                _PUSH_TASK_PATH,
                authorization=token.header_value if token is not None else "",
            )
            self._lean_workers[target] = client
        try:
            raw = await client.call(request.SerializeToString(), None)
            return core_worker_pb2.PushTaskReply.FromString(raw)
        except (H2CallError, DecodeError) as err:
            self.forget_worker(worker)
            detail = err.details if isinstance(err, H2CallError) else "undecodable reply"
            raise WorkerUnreachable(
                worker.worker_id, f"worker {worker.worker_id.hex()} at {target} PushTask: {detail}"
            ) from None

    def forget_worker(self, worker: common_pb2.Address) -> None:
        target = worker_address(worker)
        client = self._lean_workers.pop(target, None)
        if client is not None:
            client.close()
        channel = self._workers.pop(target, None)
        if channel is not None:
            self._closing.spawn(channel.close(grace=None), "close-channel")

    async def close(self) -> None:
        for client in self._lean_workers.values():
            client.close()
        self._lean_workers.clear()
        channels = list(self._workers.values())
        self._workers.clear()
        for channel in channels:
            await channel.close(grace=None)
        await self._closing.settle()
