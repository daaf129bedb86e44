"""``ray.rpc.JobInfoGcsService`` and ``ray.rpc.PlacementGroupInfoGcsService``."""

from __future__ import annotations

from typing import Any

from gcs.managers.jobs import JobManager, JobRejected
from gcs.managers.placement_groups import PlacementGroupManager
from gcs.proto import gcs_service_pb2
from gcs.rpc.errors import InvalidArgument, NotFound
from gcs.services.common import error_status, ok_status

Req = gcs_service_pb2


class JobInfoServicer:
    def __init__(self, jobs: JobManager) -> None:
        self._jobs = jobs

    async def AddJob(self, request: Req.AddJobRequest, context: Any) -> Any:
        try:
            await self._jobs.add(request.data)
        except JobRejected as err:
            return Req.AddJobReply(status=error_status(err))
        return Req.AddJobReply(status=ok_status())

    async def MarkJobFinished(self, request: Req.MarkJobFinishedRequest, context: Any) -> Any:
        await self._jobs.mark_finished(request.job_id)
        return Req.MarkJobFinishedReply(status=ok_status())

    async def GetAllJobInfo(self, request: Req.GetAllJobInfoRequest, context: Any) -> Any:
        if request.HasField("limit") and request.limit < 0:
            raise InvalidArgument(f"limit must be >= 0, got {request.limit}")
        out = Req.GetAllJobInfoReply(status=ok_status())
        for job in self._jobs.jobs.values():
            if request.HasField("limit") and 0 < request.limit <= len(out.job_info_list):
                break
            if request.job_or_submission_id and job.job_id.hex() != request.job_or_submission_id:
                continue
            out.job_info_list.append(job)
        return out

    async def GetNextJobID(self, request: Any, context: Any) -> Any:
        return Req.GetNextJobIDReply(status=ok_status(), job_id=await self._jobs.next_job_id())


class PlacementGroupInfoServicer:
    def __init__(self, pgs: PlacementGroupManager) -> None:
        self._pgs = pgs

    async def CreatePlacementGroup(self, request: Any, context: Any) -> Any:
        await self._pgs.create(request.placement_group_spec)
        return Req.CreatePlacementGroupReply(status=ok_status())

    async def RemovePlacementGroup(self, request: Any, context: Any) -> Any:
        try:
            await self._pgs.remove(request.placement_group_id)
        except NotFound as err:
            return Req.RemovePlacementGroupReply(status=error_status(err))
        return Req.RemovePlacementGroupReply(status=ok_status())

    async def GetPlacementGroup(self, request: Any, context: Any) -> Any:
        pg = self._pgs.get(request.placement_group_id)
        out = Req.GetPlacementGroupReply(status=ok_status())
        if pg is not None:
            out.placement_group_table_data.CopyFrom(pg)
        return out

    async def GetAllPlacementGroup(self, request: Any, context: Any) -> Any:
        out = Req.GetAllPlacementGroupReply(status=ok_status(), total=len(self._pgs.groups))
        limit = request.limit if request.HasField("limit") and request.limit > 0 else None
        for pg in self._pgs.groups.values():
            if limit is not None and len(out.placement_group_table_data) >= limit:
                break
            out.placement_group_table_data.append(pg)
        return out
