"""``ray.rpc.NodeResourceInfoGcsService``: reads the load-poll cache."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gcs.config import RequestLimits
from gcs.managers.nodes import NodeManager
from gcs.managers.placement_groups import PlacementGroupManager
from gcs.managers.resources import ResourceCache
from gcs.proto import gcs_service_pb2
from gcs.services.common import ReplySize, ok_status

Req = gcs_service_pb2
NodeFilter = Callable[[str], frozenset[bytes] | None]


class NodeResourceInfoServicer:
    def __init__(
        self,
        nodes: NodeManager,
        cache: ResourceCache,
        pgs: PlacementGroupManager,
        *,
        virtual_cluster_nodes: NodeFilter | None = None,
        limits: RequestLimits,
    ) -> None:
        self._max_reply_bytes = limits.max_reply_bytes
        self._nodes = nodes
        self._cache = cache
        self._pgs = pgs
        self._vc_nodes = virtual_cluster_nodes

    def _entries(self, virtual_cluster_id: str) -> Any:
        """The cache's nodes, restricted to a virtual cluster (unknown id: none)."""
        if not virtual_cluster_id:
            return self._cache.nodes.items()
        members = self._vc_nodes(virtual_cluster_id) if self._vc_nodes is not None else frozenset()
        if members is None:
            return self._cache.nodes.items()
        return [(n, e) for n, e in self._cache.nodes.items() if n in members]

    async def GetAllAvailableResources(self, request: Any, context: Any) -> Any:
        out = Req.GetAllAvailableResourcesReply(status=ok_status())
        for node_id, entry in self._entries(request.virtual_cluster_id):
            out.resources_list.add(
                node_id=node_id, resources_available=entry.data.resources_available
            )
        return out

    async def GetAllTotalResources(self, request: Any, context: Any) -> Any:
        out = Req.GetAllTotalResourcesReply(status=ok_status())
        for node_id, entry in self._entries(request.virtual_cluster_id):
            out.resources_list.add(node_id=node_id, resources_total=entry.data.resources_total)
        return out

    async def GetDrainingNodes(self, request: Any, context: Any) -> Any:
        out = Req.GetDrainingNodesReply(status=ok_status())
        for node_id, deadline in self._cache.draining():
            out.draining_nodes.add(node_id=node_id, draining_deadline_timestamp_ms=deadline)
        return out

    async def GetAllResourceUsage(self, request: Any, context: Any) -> Any:
        out = Req.GetAllResourceUsageReply(status=ok_status())
        usage = out.resource_usage_data
        size = ReplySize(self._max_reply_bytes, "node resource usages")
        for entry in self._cache.nodes.values():
            size.add(entry.data)
            usage.batch.append(entry.data)
        for (shape, selectors), (ready, infeasible, backlog) in self._cache.demand.items():
            demand = usage.resource_load_by_shape.resource_demands.add(
                shape=dict(shape),
                num_ready_requests_queued=ready,
                num_infeasible_requests_queued=infeasible,
                backlog_size=backlog,
            )
            for raw in selectors:
                demand.label_selectors.add().ParseFromString(raw)
        for pg in self._pgs.pending():
            size.add(pg)
            usage.placement_group_load.placement_group_data.append(pg)
        return out
