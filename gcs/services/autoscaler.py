"""``ray.rpc.autoscaler.AutoscalerStateService`` (all seven RPCs)."""

from __future__ import annotations

from typing import Any

from gcs.base.ids import require_node_id
from gcs.base.protowire import varint
from gcs.config import RequestLimits
from gcs.managers.autoscaler_state import AutoscalerStateManager
from gcs.proto import autoscaler_pb2
from gcs.rpc.errors import (
    InvalidArgument,
    NotFound,
    RayStatusCode,
    RayStatusError,
    as_ray_status,
)
from gcs.services import validate

A = autoscaler_pb2
_GET_STATE_REPLY_FIELD = b"\x0a"  # GetClusterResourceStateReply.cluster_resource_state = 1


class AutoscalerStateServicer:
    def __init__(self, manager: AutoscalerStateManager, *, limits: RequestLimits) -> None:
        self._m = manager
        self._limits = limits

    async def GetClusterResourceState(self, request: Any, context: Any) -> bytes:
        last_seen = request.last_seen_cluster_resource_state_version
        validate.non_negative(last_seen, "last_seen_cluster_resource_state_version")
        state = await self._m.cluster_resource_state_bytes(last_seen)
        return _GET_STATE_REPLY_FIELD + varint(len(state)) + state

    async def GetClusterStatus(self, request: Any, context: Any) -> bytes:
        return await self._m.cluster_status()

    async def RequestClusterResourceConstraint(self, request: Any, context: Any) -> Any:
        constraint = request.cluster_resource_constraint
        f, lim = "cluster_resource_constraint", self._limits
        validate.entries(constraint.resource_requests, f"{f}.resource_requests", lim.max_bundles)
        for i, by_count in enumerate(constraint.resource_requests):
            where = f"{f}.resource_requests[{i}]"
            validate.non_negative(by_count.count, f"{where}.count")
            validate.resource_map(
                by_count.request.resources_bundle, f"{where}.request.resources_bundle", lim
            )
        validate.strings_in(constraint, f, lim.max_name_bytes)
        validate.record(constraint, f, lim.max_record_bytes)
        await self._m.set_constraint(constraint)
        return A.RequestClusterResourceConstraintReply()

    async def ReportAutoscalingState(self, request: Any, context: Any) -> Any:
        state, f, lim = request.autoscaling_state, "autoscaling_state", self._limits
        validate.non_negative(state.autoscaler_state_version, f"{f}.autoscaler_state_version")
        validate.non_negative(
            state.last_seen_cluster_resource_state_version,
            f"{f}.last_seen_cluster_resource_state_version",
        )
        validate.amounts_in(state, f)
        validate.strings_in(state, f, lim.max_text_bytes)
        validate.record(state, f, lim.max_record_bytes)
        await self._m.report_autoscaling_state(state)
        return A.ReportAutoscalingStateReply()

    async def ReportClusterConfig(self, request: Any, context: Any) -> Any:
        validate.strings_in(request.cluster_config, "cluster_config", self._limits.max_text_bytes)
        validate.record(request.cluster_config, "cluster_config", self._limits.max_record_bytes)
        await self._m.report_cluster_config(request.cluster_config)
        return A.ReportClusterConfigReply()

    async def DrainNode(self, request: A.DrainNodeRequest, context: Any) -> Any:
        require_node_id(request.node_id)
        validate.enum_value(request.reason, A.DrainNodeReason.DESCRIPTOR, "reason")
        validate.text(request.reason_message, "reason_message", self._limits.max_text_bytes)
        if request.deadline_timestamp_ms < 0:  # Ray 2.60's words, ABORTED "Invalid"
            raise RayStatusError(
                RayStatusCode.Invalid,
                f"Draining deadline must be non-negative, received {request.deadline_timestamp_ms}",
            )
        return await self._m.drain_node(request)

    async def ResizeRayletResourceInstances(self, request: Any, context: Any) -> Any:
        try:  # Ray answers ABORTED "InvalidArgument" / "NotFound" here
            require_node_id(request.node_id)
            validate.resource_map(request.resources, "resources", self._limits)
            return await self._m.resize(request)
        except (InvalidArgument, NotFound) as err:
            raise as_ray_status(err) from None
