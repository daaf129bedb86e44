"""``ray.rpc.NodeInfoGcsService``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gcs
from gcs import validate
from gcs.ids import require_node_id
from gcs.managers.nodes import ALIVE, NodeManager, address_and_liveness
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2
from gcs.rpc.errors import InvalidArgument
from gcs.services.common import ok_status

Req = gcs_service_pb2
NodeFilter = Callable[[str], frozenset[bytes] | None]
"""virtual cluster id -> its node ids (None: no filter; unknown cluster: empty)."""


def validate_node_info(info: gcs_pb2.GcsNodeInfo, *, max_entries: int) -> None:
    require_node_id(info.node_id, "node_info.node_id")
    if not info.node_manager_address:
        raise InvalidArgument("node_info.node_manager_address is required")
    validate.port(info.node_manager_port, "node_info.node_manager_port")
    validate.port(info.object_manager_port, "node_info.object_manager_port", required=False)
    validate.resource_map(
        info.resources_total, "node_info.resources_total", max_entries=max_entries
    )
    validate.label_map(info.labels, "node_info.labels", max_entries=max_entries)
    if info.state != ALIVE:
        raise InvalidArgument("node_info.state must be ALIVE when registering")


class NodeInfoServicer:
    def __init__(
        self,
        nodes: NodeManager,
        cluster_id: bytes,
        *,
        max_entries: int,
        virtual_cluster_nodes: NodeFilter | None = None,
    ) -> None:
        self._nodes = nodes
        self._cluster_id = cluster_id
        self._max_entries = max_entries
        self._vc_nodes = virtual_cluster_nodes

    async def GetClusterId(self, request: Any, context: Any) -> Req.GetClusterIdReply:
        return Req.GetClusterIdReply(status=ok_status(), cluster_id=self._cluster_id)

    async def RegisterNode(self, request: Req.RegisterNodeRequest, context: Any) -> Any:
        info = gcs_pb2.GcsNodeInfo()
        info.CopyFrom(request.node_info)
        validate_node_info(info, max_entries=self._max_entries)
        await self._nodes.register(info)
        return Req.RegisterNodeReply(status=ok_status())

    async def UnregisterNode(self, request: Req.UnregisterNodeRequest, context: Any) -> Any:
        node_id = require_node_id(request.node_id)
        validate.enum_value(
            request.node_death_info.reason,
            common_pb2.NodeDeathInfo.Reason.DESCRIPTOR,
            "node_death_info.reason",
        )
        await self._nodes.unregister(node_id, request.node_death_info)
        return Req.UnregisterNodeReply(status=ok_status())

    async def DrainNode(self, request: Req.DrainNodeRequest, context: Any) -> Any:
        """Legacy drain: the node is told to shut down gracefully and marked dead."""
        reply = Req.DrainNodeReply(status=ok_status())
        for i, data in enumerate(request.drain_node_data):
            node_id = require_node_id(data.node_id, f"drain_node_data[{i}].node_id")
            if self._nodes.is_alive(node_id):
                await self._nodes.mark_dead(
                    node_id, common_pb2.NodeDeathInfo.EXPECTED_TERMINATION, "drained via DrainNode"
                )
            reply.drain_node_status.add(node_id=node_id)
        return reply

    async def GetAllNodeInfo(self, request: Req.GetAllNodeInfoRequest, context: Any) -> Any:
        if request.HasField("limit") and request.limit < 0:
            raise InvalidArgument(f"limit must be >= 0, got {request.limit}")
        if request.HasField("state_filter"):
            validate.enum_value(
                request.state_filter, gcs_pb2.GcsNodeInfo.GcsNodeState.DESCRIPTOR, "state_filter"
            )
        selectors = list(request.node_selectors)
        for i, sel in enumerate(selectors):
            kind = sel.WhichOneof("node_selector")
            if kind is None:
                raise InvalidArgument(f"node_selectors[{i}] sets no selector")
            if kind == "node_id":
                require_node_id(sel.node_id, f"node_selectors[{i}].node_id")
        if selectors and all(s.WhichOneof("node_selector") == "node_id" for s in selectors):
            candidates = [n for s in selectors if (n := self._nodes.get(s.node_id)) is not None]
        else:
            candidates = list(self._nodes.all_nodes())
        legacy = _legacy_filter(request, self._vc_nodes)
        out = Req.GetAllNodeInfoReply(status=ok_status(), total=self._nodes.total())
        limit = request.limit if request.HasField("limit") and request.limit > 0 else None
        for node in candidates:
            if request.HasField("state_filter") and node.state != request.state_filter:
                continue
            if selectors and not any(_matches(node, s) for s in selectors):
                continue
            if legacy is not None and not legacy(node):
                continue
            if limit is not None and len(out.node_info_list) >= limit:
                break
            out.node_info_list.append(node)
        out.num_filtered = out.total - len(out.node_info_list)
        return out

    async def GetAllNodeAddressAndLiveness(self, request: Any, context: Any) -> Any:
        if request.HasField("limit") and request.limit < 0:
            raise InvalidArgument(f"limit must be >= 0, got {request.limit}")
        if request.HasField("state_filter"):
            validate.enum_value(
                request.state_filter, gcs_pb2.GcsNodeInfo.GcsNodeState.DESCRIPTOR, "state_filter"
            )
        if request.node_ids:
            ids = [require_node_id(n, f"node_ids[{i}]") for i, n in enumerate(request.node_ids)]
            candidates = [n for i in ids if (n := self._nodes.get(i)) is not None]
        else:
            candidates = list(self._nodes.all_nodes())
        limit = request.limit if request.HasField("limit") and request.limit > 0 else None
        out = Req.GetAllNodeAddressAndLivenessReply(status=ok_status())
        for node in candidates:
            if request.HasField("state_filter") and node.state != request.state_filter:
                continue
            if limit is not None and len(out.node_info_list) >= limit:
                break
            out.node_info_list.append(address_and_liveness(node))
        return out

    async def CheckAlive(self, request: Req.CheckAliveRequest, context: Any) -> Any:
        alive = [self._nodes.is_alive(n) for n in request.node_ids]
        return Req.CheckAliveReply(
            status=ok_status(), ray_version=gcs.RAY_VERSION, raylet_alive=alive, is_leader=True
        )


def _legacy_filter(
    request: Req.GetAllNodeInfoRequest, vc_nodes: NodeFilter | None
) -> Callable[[gcs_pb2.GcsNodeInfo], bool] | None:
    """ant-ray's ``filters`` (field 4): every set field must match; ``virtual_cluster_id``
    keeps the cluster's nodes (dead ones still listed there included)."""
    if not request.HasField("filters"):
        return None
    f = request.filters
    members = None
    if f.HasField("virtual_cluster_id") and f.virtual_cluster_id:
        members = vc_nodes(f.virtual_cluster_id) if vc_nodes is not None else frozenset()
    if f.HasField("state"):
        validate.enum_value(f.state, gcs_pb2.GcsNodeInfo.GcsNodeState.DESCRIPTOR, "filters.state")

    def keep(node: gcs_pb2.GcsNodeInfo) -> bool:
        if f.HasField("node_id") and node.node_id != f.node_id:
            return False
        if f.HasField("state") and node.state != f.state:
            return False
        if f.HasField("node_name") and node.node_name != f.node_name:
            return False
        if f.HasField("node_ip_address") and node.node_manager_address != f.node_ip_address:
            return False
        return members is None or node.node_id in members

    return keep


def _matches(node: gcs_pb2.GcsNodeInfo, sel: Req.GetAllNodeInfoRequest.NodeSelector) -> bool:
    kind = sel.WhichOneof("node_selector")
    if kind == "node_id":
        return node.node_id == sel.node_id
    if kind == "node_name":
        return node.node_name == sel.node_name
    if kind == "node_ip_address":
        return node.node_manager_address == sel.node_ip_address
    return node.is_head_node == sel.is_head_node
