"""``ray.rpc``'s WorkerInfoGcsService, TaskInfoGcsService and RuntimeEnvGcsService.

Every core worker and driver calls these (worker registration and exit, task events each
second, runtime-env URI pins); unanswered, each process logs an error per call.
"""

from __future__ import annotations

from typing import Any

from gcs.base.errors import NotFound
from gcs.config import RequestLimits
from gcs.managers.runtime_env import RuntimeEnvPins
from gcs.managers.tasks import TaskEventStore
from gcs.managers.workers import WorkerManager, require_worker_id
from gcs.proto import gcs_pb2, gcs_service_pb2
from gcs.rpc.errors import InvalidArgument
from gcs.services import validate
from gcs.services.common import ReplySize, error_status, ok_status

Req = gcs_service_pb2


class WorkerInfoServicer:
    def __init__(self, workers: WorkerManager, *, limits: RequestLimits) -> None:
        self._workers = workers
        self._limits = limits

    def _bounded(self, data: gcs_pb2.WorkerTableData, field: str) -> gcs_pb2.WorkerTableData:
        lim = self._limits
        validate.entries(data.worker_info, f"{field}.worker_info", lim.max_repeated_entries)
        validate.strings_in(data, field, lim.max_text_bytes)
        validate.record(data, field, lim.max_record_bytes)
        return data

    async def AddWorkerInfo(self, request: Req.AddWorkerInfoRequest, context: Any) -> Any:
        await self._workers.add(self._bounded(request.worker_data, "worker_data"))
        return Req.AddWorkerInfoReply(status=ok_status())

    async def ReportWorkerFailure(
        self, request: Req.ReportWorkerFailureRequest, context: Any
    ) -> Any:
        await self._workers.report_failure(self._bounded(request.worker_failure, "worker_failure"))
        return Req.ReportWorkerFailureReply(status=ok_status())

    async def GetWorkerInfo(self, request: Req.GetWorkerInfoRequest, context: Any) -> Any:
        data = self._workers.get(require_worker_id(request.worker_id))
        reply = Req.GetWorkerInfoReply(status=ok_status())
        if data is not None:  # Ray: OK with no record for an unknown worker
            reply.worker_table_data.CopyFrom(data)
        return reply

    async def GetAllWorkerInfo(self, request: Req.GetAllWorkerInfoRequest, context: Any) -> Any:
        limit = request.limit if request.HasField("limit") and request.limit > 0 else None
        f = request.filters
        reply = Req.GetAllWorkerInfoReply(status=ok_status(), total=self._workers.total())
        size = ReplySize(self._limits.max_reply_bytes, "workers")
        for data in self._workers.all_workers():
            if f.HasField("is_alive") and data.is_alive != f.is_alive:
                reply.num_filtered += 1
                continue
            if f.HasField("exist_paused_threads") and (data.num_paused_threads > 0) != (
                f.exist_paused_threads
            ):
                reply.num_filtered += 1
                continue
            if limit is not None and len(reply.worker_table_data) >= limit:
                break
            size.add(data)
            reply.worker_table_data.append(data)
        return reply

    async def UpdateWorkerDebuggerPort(
        self, request: Req.UpdateWorkerDebuggerPortRequest, context: Any
    ) -> Any:
        validate.port(request.debugger_port, "debugger_port", required=False)
        try:
            await self._workers.update_debugger_port(
                require_worker_id(request.worker_id), request.debugger_port
            )
        except NotFound as err:  # Ray answers NotFound in the reply's status
            return Req.UpdateWorkerDebuggerPortReply(status=error_status(err))
        return Req.UpdateWorkerDebuggerPortReply(status=ok_status())

    async def UpdateWorkerNumPausedThreads(
        self, request: Req.UpdateWorkerNumPausedThreadsRequest, context: Any
    ) -> Any:
        try:
            await self._workers.update_paused_threads(
                require_worker_id(request.worker_id), request.num_paused_threads_delta
            )
        except NotFound as err:
            return Req.UpdateWorkerNumPausedThreadsReply(status=error_status(err))
        return Req.UpdateWorkerNumPausedThreadsReply(status=ok_status())


class TaskInfoServicer:
    def __init__(self, tasks: TaskEventStore, *, limits: RequestLimits) -> None:
        self._tasks = tasks
        self._limits = limits

    async def AddTaskEventData(self, request: Req.AddTaskEventDataRequest, context: Any) -> Any:
        lim = self._limits
        data = request.data
        validate.entries(data.events_by_task, "data.events_by_task", lim.max_repeated_entries)
        validate.entries(
            data.dropped_task_attempts, "data.dropped_task_attempts", lim.max_repeated_entries
        )
        self._tasks.add(data)
        return Req.AddTaskEventDataReply(status=ok_status())

    async def GetTaskEvents(self, request: Req.GetTaskEventsRequest, context: Any) -> bytes:
        f = request.filters
        for name in ("job_filters", "task_filters", "actor_filters", "task_name_filters"):
            validate.entries(getattr(f, name), f"filters.{name}", self._limits.max_repeated_entries)
        validate.entries(
            f.state_filters, "filters.state_filters", self._limits.max_repeated_entries
        )
        # room for the counters and the status beside the events
        return self._tasks.query_wire(request, max_bytes=self._limits.max_reply_bytes - 1024)


class RuntimeEnvServicer:
    def __init__(self, pins: RuntimeEnvPins, *, limits: RequestLimits) -> None:
        self._pins = pins
        self._limits = limits

    async def PinRuntimeEnvURI(self, request: Req.PinRuntimeEnvURIRequest, context: Any) -> Any:
        if not request.uri:
            raise InvalidArgument("uri is empty")
        validate.text(request.uri, "uri", self._limits.max_text_bytes)
        # Ray 2.60 takes a negative expiry (OK): nothing is kept past now
        self._pins.pin(request.uri, max(request.expiration_s, 0))
        return Req.PinRuntimeEnvURIReply(status=ok_status())
