"""``ray.rpc.autoscaler.AutoscalerStateService`` (all seven RPCs)."""

from __future__ import annotations

from typing import Any

from gcs import validate
from gcs.ids import require_node_id
from gcs.managers.autoscaler_state import AutoscalerStateManager
from gcs.proto import autoscaler_pb2
from gcs.rpc.errors import InvalidArgument, RayStatusCode, RayStatusError
from gcs.wire_encoding import varint

A = autoscaler_pb2
_GET_STATE_REPLY_FIELD = b"\x0a"  # GetClusterResourceStateReply.cluster_resource_state = 1


class AutoscalerStateServicer:
    def __init__(self, manager: AutoscalerStateManager, *, max_entries: int) -> None:
        self._m = manager
        self._max_entries = max_entries

    async def GetClusterResourceState(self, request: Any, context: Any) -> bytes:
        state = await self._m.cluster_resource_state_bytes(
            request.last_seen_cluster_resource_state_version
        )
        return _GET_STATE_REPLY_FIELD + varint(len(state)) + state

    async def GetClusterStatus(self, request: Any, context: Any) -> Any:
        return await self._m.cluster_status()

    async def RequestClusterResourceConstraint(self, request: Any, context: Any) -> Any:
        await self._m.set_constraint(request.cluster_resource_constraint)
        return A.RequestClusterResourceConstraintReply()

    async def ReportAutoscalingState(self, request: Any, context: Any) -> Any:
        await self._m.report_autoscaling_state(request.autoscaling_state)
        return A.ReportAutoscalingStateReply()

    async def ReportClusterConfig(self, request: Any, context: Any) -> Any:
        await self._m.report_cluster_config(request.cluster_config)
        return A.ReportClusterConfigReply()

    async def DrainNode(self, request: A.DrainNodeRequest, context: Any) -> Any:
        require_node_id(request.node_id)
        validate.enum_value(request.reason, A.DrainNodeReason.DESCRIPTOR, "reason")
        return await self._m.drain_node(request)

    async def ResizeRayletResourceInstances(self, request: Any, context: Any) -> Any:
        try:
            require_node_id(request.node_id)
            validate.resource_map(request.resources, "resources", max_entries=self._max_entries)
        except InvalidArgument as err:  # Ray answers ABORTED "InvalidArgument" here
            raise RayStatusError(RayStatusCode.InvalidArgument, err.message) from None
        return await self._m.resize(request)
