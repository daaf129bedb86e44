"""``ray.rpc.ActorInfoGcsService``: validate, call the actor manager, encode.

Ray reports actor errors inside the reply's ``GcsStatus`` (gRPC OK): a name conflict is
AlreadyExists, an unknown actor NotFound.  Undecodable or malformed requests are gRPC
INVALID_ARGUMENT naming the field.  Lookups first let the mutations already received finish
(:meth:`ActorManager.caught_up`): Ray's clients send some writes without waiting for them.
"""

from __future__ import annotations

import contextlib
from typing import Any

from gcs.base.errors import (
    AlreadyExists,
    FailedPrecondition,
    NotFound,
    RayStatusCode,
    RayStatusError,
)
from gcs.base.ids import JOB_ID_SIZE
from gcs.config import RequestLimits
from gcs.managers.actors import ACTOR_ID_SIZE, ActorManager
from gcs.proto import common_pb2, gcs_service_pb2
from gcs.services import validate
from gcs.services.common import ReplySize, error_status, ok_status

Req = gcs_service_pb2


class ActorInfoServicer:
    def __init__(self, actors: ActorManager, *, limits: RequestLimits) -> None:
        self._actors = actors
        self._limits = limits

    def _spec(self, spec: common_pb2.TaskSpec) -> None:
        creation = spec.actor_creation_task_spec
        lim = self._limits
        validate.text(creation.name, "task_spec.actor_creation_task_spec.name", lim.max_name_bytes)
        validate.text(
            creation.ray_namespace,
            "task_spec.actor_creation_task_spec.ray_namespace",
            lim.max_name_bytes,
        )
        validate.fixed_id(spec.job_id, "task_spec.job_id", JOB_ID_SIZE)
        validate.resource_map(spec.required_resources, "task_spec.required_resources", lim)
        validate.resource_map(
            spec.required_placement_resources, "task_spec.required_placement_resources", lim
        )
        validate.record(spec, "task_spec", lim.max_record_bytes)

    async def RegisterActor(self, request: Req.RegisterActorRequest, context: Any) -> Any:
        self._spec(request.task_spec)
        try:
            await self._actors.register(request.task_spec)
        except AlreadyExists as err:
            return Req.RegisterActorReply(status=error_status(err))
        return Req.RegisterActorReply(status=ok_status())

    async def CreateActor(self, request: Req.CreateActorRequest, context: Any) -> Any:
        self._spec(request.task_spec)
        try:
            return await self._actors.create(request.task_spec)
        except FailedPrecondition as err:
            return Req.CreateActorReply(status=error_status(err))

    async def GetActorInfo(self, request: Req.GetActorInfoRequest, context: Any) -> Any:
        validate.text(request.name, "name", self._limits.max_name_bytes)
        await self._actors.caught_up()
        out = Req.GetActorInfoReply(status=ok_status())
        actor = self._actors.get(request.actor_id) if request.actor_id else None
        if actor is not None:
            out.actor_table_data.CopyFrom(actor)
        return out

    async def GetNamedActorInfo(self, request: Req.GetNamedActorInfoRequest, context: Any) -> Any:
        validate.text(request.name, "name", self._limits.max_name_bytes)
        validate.text(request.ray_namespace, "ray_namespace", self._limits.max_name_bytes)
        await self._actors.caught_up()
        try:
            actor = self._actors.get_named(request.name, request.ray_namespace)
        except NotFound as err:
            return Req.GetNamedActorInfoReply(status=error_status(err))
        out = Req.GetNamedActorInfoReply(status=ok_status())
        out.actor_table_data.CopyFrom(actor)
        spec = self._actors.spec_of(actor.actor_id)
        if spec is not None:
            out.task_spec.CopyFrom(spec)
        return out

    async def ListNamedActors(self, request: Req.ListNamedActorsRequest, context: Any) -> Any:
        validate.text(request.ray_namespace, "ray_namespace", self._limits.max_name_bytes)
        await self._actors.caught_up()
        out = Req.ListNamedActorsReply(status=ok_status())
        size = ReplySize(self._limits.max_reply_bytes, "named actors")
        for namespace, name in self._actors.list_named(
            request.ray_namespace, request.all_namespaces
        ):
            size.add_bytes(len(namespace) + len(name) + 4)
            out.named_actors_list.add(ray_namespace=namespace, name=name)
        return out

    async def GetAllActorInfo(self, request: Req.GetAllActorInfoRequest, context: Any) -> Any:
        filters = request.filters
        actor_id = filters.actor_id if filters.HasField("actor_id") else None
        job_id = filters.job_id if filters.HasField("job_id") else None
        if actor_id is not None:
            validate.fixed_id(actor_id, "filters.actor_id", ACTOR_ID_SIZE)
        if job_id is not None:
            validate.fixed_id(job_id, "filters.job_id", JOB_ID_SIZE)
        state = filters.state if filters.HasField("state") else None
        await self._actors.caught_up()
        out = Req.GetAllActorInfoReply(status=ok_status())
        _, out.total, out.num_filtered = self._actors.list_all(
            actor_id=actor_id,
            job_id=job_id,
            state=state,
            limit=request.limit if request.HasField("limit") and request.limit > 0 else None,
            into=out.actor_table_data,
        )
        size = ReplySize(self._limits.max_reply_bytes, "actors")
        for actor in out.actor_table_data:
            size.add(actor)
        return out

    async def KillActorViaGcs(self, request: Req.KillActorViaGcsRequest, context: Any) -> Any:
        try:
            await self._actors.kill(
                request.actor_id, force_kill=request.force_kill, no_restart=request.no_restart
            )
        except NotFound as err:
            return Req.KillActorViaGcsReply(status=error_status(err))
        return Req.KillActorViaGcsReply(status=ok_status())

    async def ReportActorOutOfScope(
        self, request: Req.ReportActorOutOfScopeRequest, context: Any
    ) -> Any:
        with contextlib.suppress(NotFound):  # Ray 2.60: OK for an actor it does not know
            await self._actors.report_out_of_scope(
                request.actor_id, request.num_restarts_due_to_lineage_reconstruction
            )
        return Req.ReportActorOutOfScopeReply(status=ok_status())

    async def RestartActorForLineageReconstruction(
        self, request: Req.RestartActorForLineageReconstructionRequest, context: Any
    ) -> Any:
        try:
            await self._actors.restart_for_lineage(
                request.actor_id, request.num_restarts_due_to_lineage_reconstruction
            )
        except NotFound:  # Ray 2.60's answer for an actor it does not know
            dead = RayStatusError(RayStatusCode.Invalid, "Actor is permanently dead.")
            return Req.RestartActorForLineageReconstructionReply(status=error_status(dead))
        except FailedPrecondition as err:
            return Req.RestartActorForLineageReconstructionReply(status=error_status(err))
        return Req.RestartActorForLineageReconstructionReply(status=ok_status())
