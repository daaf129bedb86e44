"""The one call the GCS makes to a job's driver: ``CoreWorkerService.NumPendingTasks``.

Ray's ``GetAllJobInfo`` asks each running job's driver (its core worker, at
``JobTableData.driver_address``) how many tasks it still has pending, with a 1 s deadline,
to fill ``is_running_tasks``.  :class:`DriverGateway` is what the job view sees (no
transport types); a failed call leaves as :class:`~gcs.base.errors.WorkerUnreachable`.
"""

from __future__ import annotations

from typing import Protocol

import grpc

from gcs.base.errors import WorkerUnreachable
from gcs.proto import common_pb2, core_worker_pb2
from gcs.rpc.descriptors import CORE_WORKER
from gcs.rpc.method_paths import method_path
from gcs.rpc.raylet_io.pool import CHANNEL_OPTIONS
from gcs.rpc.security import NO_SECURITY, Security

__all__ = ["DriverGateway", "GrpcDriverGateway"]

_PATH = method_path(CORE_WORKER.methods_by_name["NumPendingTasks"])


class DriverGateway(Protocol):
    async def num_pending_tasks(self, driver: common_pb2.Address, timeout_s: float) -> int:
        """The driver's pending tasks; WorkerUnreachable when it does not answer in time."""
        ...


class GrpcDriverGateway:
    """One short-lived channel per call: the call is rare (a job listing) and drivers come
    and go, so nothing is cached that would have to be forgotten."""

    def __init__(self, *, security: Security = NO_SECURITY) -> None:
        self._security = security

    async def num_pending_tasks(self, driver: common_pb2.Address, timeout_s: float) -> int:
        target = f"{driver.ip_address}:{driver.port}"
        channel = self._security.aio_channel(target, options=CHANNEL_OPTIONS)
        try:
            call = channel.unary_unary(
                _PATH,
                request_serializer=core_worker_pb2.NumPendingTasksRequest.SerializeToString,
                response_deserializer=core_worker_pb2.NumPendingTasksReply.FromString,
                _registered_method=True,
            )
            reply = await call(core_worker_pb2.NumPendingTasksRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            detail = err.details() or err.code().name
            raise WorkerUnreachable(
                driver.worker_id, f"driver at {target} NumPendingTasks: {detail}"
            ) from None
        finally:
            await channel.close(grace=None)
        return int(reply.num_pending_tasks)
