"""``ray.rpc.JobInfoGcsService`` and ``ray.rpc.PlacementGroupInfoGcsService``."""

from __future__ import annotations

from typing import Any

from gcs.base.ids import JOB_ID_SIZE, NODE_ID_SIZE
from gcs.config import RequestLimits
from gcs.managers.job_view import JobView
from gcs.managers.jobs import VIRTUAL_CLUSTER_METADATA_KEY, JobManager, JobRejected
from gcs.managers.placement_groups import PlacementGroupManager
from gcs.proto import common_pb2, gcs_service_pb2
from gcs.rpc.errors import FailedPrecondition, NotFound, RayStatusCode, RayStatusError
from gcs.services import validate
from gcs.services.common import ReplySize, error_status, ok_status

Req = gcs_service_pb2
ACTOR_ID_SIZE = 16
PG_ID_SIZE = 18


class JobInfoServicer:
    def __init__(self, jobs: JobManager, view: JobView, *, limits: RequestLimits) -> None:
        self._jobs = jobs
        self._view = view
        self._limits = limits

    async def AddJob(self, request: Req.AddJobRequest, context: Any) -> Any:
        data, lim = request.data, self._limits
        validate.text(data.virtual_cluster_id, "data.virtual_cluster_id", lim.max_name_bytes)
        validate.text(
            data.config.metadata.get(VIRTUAL_CLUSTER_METADATA_KEY, ""),
            f"data.config.metadata[{VIRTUAL_CLUSTER_METADATA_KEY}]",
            lim.max_name_bytes,
        )
        validate.text(data.driver_ip_address, "data.driver_ip_address", lim.max_address_bytes)
        validate.text(data.entrypoint, "data.entrypoint", lim.max_text_bytes)
        validate.record(data, "data", lim.max_record_bytes)
        try:
            await self._jobs.add(request.data)
        except JobRejected as err:
            return Req.AddJobReply(status=error_status(err))
        return Req.AddJobReply(status=ok_status())

    async def MarkJobFinished(self, request: Req.MarkJobFinishedRequest, context: Any) -> Any:
        await self._jobs.mark_finished(request.job_id)
        return Req.MarkJobFinishedReply(status=ok_status())

    async def GetAllJobInfo(self, request: Req.GetAllJobInfoRequest, context: Any) -> Any:
        """Ray 2.60's answer (:mod:`gcs.managers.job_view`); a negative limit is its
        in-reply Invalid "Invalid limit"."""
        if request.HasField("limit") and request.limit < 0:
            invalid = RayStatusError(RayStatusCode.Invalid, "Invalid limit")
            return Req.GetAllJobInfoReply(status=error_status(invalid))
        validate.text(
            request.job_or_submission_id, "job_or_submission_id", self._limits.max_name_bytes
        )
        jobs = await self._view.all_job_info(
            job_or_submission_id=(
                request.job_or_submission_id if request.HasField("job_or_submission_id") else None
            ),
            limit=request.limit if request.HasField("limit") else None,
            with_job_api_info=not request.skip_submission_job_info_field,
            with_running_tasks=not request.skip_is_running_tasks_field,
        )
        size = ReplySize(self._limits.max_reply_bytes, "jobs")
        for job in jobs:
            size.add(job)
        return Req.GetAllJobInfoReply(status=ok_status(), job_info_list=jobs)

    async def GetNextJobID(self, request: Any, context: Any) -> Any:
        return Req.GetNextJobIDReply(status=ok_status(), job_id=await self._jobs.next_job_id())


class PlacementGroupInfoServicer:
    def __init__(self, pgs: PlacementGroupManager, *, limits: RequestLimits) -> None:
        self._pgs = pgs
        self._limits = limits

    async def CreatePlacementGroup(self, request: Any, context: Any) -> Any:
        spec = request.placement_group_spec
        validate_placement_group_spec(spec, self._limits)
        try:
            await self._pgs.create(spec)
        except FailedPrecondition as err:  # name taken: Ray answers Invalid in the reply
            return Req.CreatePlacementGroupReply(status=error_status(err))
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

    async def GetNamedPlacementGroup(self, request: Any, context: Any) -> Any:
        validate.text(request.name, "name", self._limits.max_name_bytes)
        validate.text(request.ray_namespace, "ray_namespace", self._limits.max_name_bytes)
        pg = self._pgs.get_named(request.name, request.ray_namespace)
        out = Req.GetNamedPlacementGroupReply(status=ok_status())
        if pg is not None:
            out.placement_group_table_data.CopyFrom(pg)
        return out

    async def WaitPlacementGroupUntilReady(self, request: Any, context: Any) -> Any:
        """Held until the group is CREATED (OK) or removed (NotFound); the caller's
        deadline ends the wait (Ray's ``pg.wait(timeout)``)."""
        validate.fixed_id(
            request.placement_group_id, "placement_group_id", PG_ID_SIZE, required=True
        )
        try:
            await self._pgs.wait_ready(request.placement_group_id)
        except NotFound as err:
            return Req.WaitPlacementGroupUntilReadyReply(status=error_status(err))
        return Req.WaitPlacementGroupUntilReadyReply(status=ok_status())

    async def GetAllPlacementGroup(self, request: Any, context: Any) -> Any:
        out = Req.GetAllPlacementGroupReply(status=ok_status(), total=len(self._pgs.groups))
        limit = request.limit if request.HasField("limit") and request.limit > 0 else None
        size = ReplySize(self._limits.max_reply_bytes, "placement groups")
        for pg in self._pgs.groups.values():
            if limit is not None and len(out.placement_group_table_data) >= limit:
                break
            shown = self._pgs.with_live_stats(pg)
            size.add(shown)
            out.placement_group_table_data.append(shown)
        return out


def validate_placement_group_spec(spec: common_pb2.PlacementGroupSpec, lim: RequestLimits) -> None:
    """Bounded names, ids of Ray's sizes, and bundles of finite, non-negative amounts."""
    f = "placement_group_spec"
    validate.text(spec.name, f"{f}.name", lim.max_name_bytes)
    validate.fixed_id(spec.creator_job_id, f"{f}.creator_job_id", JOB_ID_SIZE)
    validate.fixed_id(spec.creator_actor_id, f"{f}.creator_actor_id", ACTOR_ID_SIZE)
    validate.fixed_id(spec.soft_target_node_id, f"{f}.soft_target_node_id", NODE_ID_SIZE)
    validate.entries(spec.bundles, f"{f}.bundles", lim.max_bundles)
    for i, bundle in enumerate(spec.bundles):
        where = f"{f}.bundles[{i}]"
        validate.resource_map(bundle.unit_resources, f"{where}.unit_resources", lim)
        validate.label_map(bundle.label_selector, f"{where}.label_selector", lim)
    validate.strings_in(spec, f, lim.max_name_bytes)
    validate.record(spec, f, lim.max_record_bytes)
