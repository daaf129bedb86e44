"""``ray.rpc.NodeInfoGcsService``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gcs
from gcs.base.ids import require_node_id
from gcs.config import RequestLimits
from gcs.managers.head import promote_head_raylet
from gcs.managers.nodes import ALIVE, NodeManager, address_and_liveness
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2
from gcs.rpc.errors import InvalidArgument
from gcs.services import validate
from gcs.services.common import ReplySize, ok_status

Req = gcs_service_pb2
NodeFilter = Callable[[str], frozenset[bytes] | None]
"""virtual cluster id -> its node ids (None: no filter; unknown cluster: empty)."""


def validate_node_info(info: gcs_pb2.GcsNodeInfo, limits: RequestLimits) -> None:
    """What a registering raylet may send: the GCS dials ``node_manager_address`` and keeps
    and republishes everything else, so every field is bounded."""
    f = "node_info"
    require_node_id(info.node_id, f"{f}.node_id")
    validate.host(info.node_manager_address, f"{f}.node_manager_address", limits.max_address_bytes)
    validate.port(info.node_manager_port, f"{f}.node_manager_port")
    validate.port(info.object_manager_port, f"{f}.object_manager_port", required=False)
    validate.text(
        info.node_manager_hostname, f"{f}.node_manager_hostname", limits.max_address_bytes
    )
    for name in ("node_name", "instance_id", "node_type_name", "instance_type_name"):
        validate.text(getattr(info, name), f"{f}.{name}", limits.max_name_bytes)
    validate.resource_map(info.resources_total, f"{f}.resources_total", limits)
    validate.label_map(info.labels, f"{f}.labels", limits)
    validate.strings_in(info, f, limits.max_text_bytes)  # paths, snapshot, death info
    validate.record(info, f, limits.max_record_bytes)
    if info.state != ALIVE:
        raise InvalidArgument("node_info.state must be ALIVE when registering")


class NodeInfoServicer:
    def __init__(
        self,
        nodes: NodeManager,
        cluster_id: bytes,
        *,
        limits: RequestLimits,
        virtual_cluster_nodes: NodeFilter | None = None,
        head: gcs_pb2.GcsNodeInfo | None = None,
    ) -> None:
        """``head``: the virtual head of ``gcs serve --head`` (``gcs.managers.head``),
        answered to head lookups while no registered raylet is the head."""
        self._nodes = nodes
        self._head = head
        self._cluster_id = cluster_id
        self._limits = limits
        self._vc_nodes = virtual_cluster_nodes

    async def GetClusterId(self, request: Any, context: Any) -> Req.GetClusterIdReply:
        return Req.GetClusterIdReply(status=ok_status(), cluster_id=self._cluster_id)

    async def RegisterNode(self, request: Req.RegisterNodeRequest, context: Any) -> Any:
        info = gcs_pb2.GcsNodeInfo()
        info.CopyFrom(request.node_info)
        validate_node_info(info, self._limits)
        if self._head is not None:  # `gcs serve --head`: its head raylet becomes the head
            promote_head_raylet(info)
        await self._nodes.register(info)
        return Req.RegisterNodeReply(status=ok_status())

    async def UnregisterNode(self, request: Req.UnregisterNodeRequest, context: Any) -> Any:
        node_id = require_node_id(request.node_id)
        validate.enum_value(
            request.node_death_info.reason,
            common_pb2.NodeDeathInfo.Reason.DESCRIPTOR,
            "node_death_info.reason",
        )
        validate.strings_in(request.node_death_info, "node_death_info", self._limits.max_text_bytes)
        await self._nodes.unregister(node_id, request.node_death_info)
        return Req.UnregisterNodeReply(status=ok_status())

    async def DrainNode(self, request: Req.DrainNodeRequest, context: Any) -> Any:
        """Legacy drain: the node is told to shut down gracefully and marked dead."""
        validate.entries(
            request.drain_node_data, "drain_node_data", self._limits.max_repeated_entries
        )
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
        if request.HasField("state_filter"):
            validate.enum_value(
                request.state_filter, gcs_pb2.GcsNodeInfo.GcsNodeState.DESCRIPTOR, "state_filter"
            )
        selectors = list(
            validate.entries(
                request.node_selectors, "node_selectors", self._limits.max_repeated_entries
            )
        )
        for i, sel in enumerate(selectors):
            kind = sel.WhichOneof("node_selector")
            if kind is None:
                raise InvalidArgument(f"node_selectors[{i}] sets no selector")
            if kind == "node_id":
                require_node_id(sel.node_id, f"node_selectors[{i}].node_id")
        wanted = _Selectors(selectors)
        if selectors and all(s.WhichOneof("node_selector") == "node_id" for s in selectors):
            ids = dict.fromkeys(s.node_id for s in selectors)  # once each, in request order
            candidates = [n for i in ids if (n := self._nodes.get(i)) is not None]
        else:
            candidates = list(self._nodes.all_nodes())
        legacy = _legacy_filter(request, self._vc_nodes)
        out = Req.GetAllNodeInfoReply(status=ok_status(), total=self._nodes.total())
        limit = request.limit if request.HasField("limit") and request.limit > 0 else None
        size = ReplySize(self._limits.max_reply_bytes, "nodes")
        for node in candidates:
            if request.HasField("state_filter") and node.state != request.state_filter:
                continue
            if selectors and not wanted.match(node):
                continue
            if legacy is not None and not legacy(node):
                continue
            if limit is not None and len(out.node_info_list) >= limit:
                break
            size.add(node)
            out.node_info_list.append(node)
        if self._head is not None and wanted.wants_head() and legacy is None:
            self._add_virtual_head(request, out, limit)
        out.num_filtered = out.total - len(out.node_info_list)
        return out

    def _add_virtual_head(
        self, request: Req.GetAllNodeInfoRequest, out: Any, limit: int | None
    ) -> None:
        assert self._head is not None
        if any(n.is_head_node and n.state == ALIVE for n in out.node_info_list):
            return  # a registered head raylet wins
        if request.HasField("state_filter") and request.state_filter != ALIVE:
            return
        if limit is not None and len(out.node_info_list) >= limit:
            return
        out.node_info_list.append(self._head)
        out.total += 1

    async def GetAllNodeAddressAndLiveness(self, request: Any, context: Any) -> Any:
        if request.HasField("state_filter"):
            validate.enum_value(
                request.state_filter, gcs_pb2.GcsNodeInfo.GcsNodeState.DESCRIPTOR, "state_filter"
            )
        validate.entries(request.node_ids, "node_ids", self._limits.max_repeated_entries)
        if request.node_ids:
            ids = [require_node_id(n, f"node_ids[{i}]") for i, n in enumerate(request.node_ids)]
            candidates = [n for i in ids if (n := self._nodes.get(i)) is not None]
        else:
            candidates = list(self._nodes.all_nodes())
        limit = request.limit if request.HasField("limit") and request.limit > 0 else None
        out = Req.GetAllNodeAddressAndLivenessReply(status=ok_status())
        size = ReplySize(self._limits.max_reply_bytes, "nodes")
        for node in candidates:
            if request.HasField("state_filter") and node.state != request.state_filter:
                continue
            if limit is not None and len(out.node_info_list) >= limit:
                break
            entry = address_and_liveness(node)
            size.add(entry)
            out.node_info_list.append(entry)
        return out

    async def CheckAlive(self, request: Req.CheckAliveRequest, context: Any) -> Any:
        validate.entries(request.node_ids, "node_ids", self._limits.max_repeated_entries)
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


class _Selectors:
    """``node_selectors`` as sets: a node matches when any selector does (O(1) per node)."""

    def __init__(self, selectors: list[Req.GetAllNodeInfoRequest.NodeSelector]) -> None:
        by_kind: dict[str, set[object]] = {}
        for sel in selectors:
            kind = sel.WhichOneof("node_selector")
            by_kind.setdefault(kind, set()).add(getattr(sel, kind))
        self._ids = by_kind.get("node_id", set())
        self._names = by_kind.get("node_name", set())
        self._ips = by_kind.get("node_ip_address", set())
        self._head = by_kind.get("is_head_node", set())

    def wants_head(self) -> bool:
        return True in self._head

    def match(self, node: gcs_pb2.GcsNodeInfo) -> bool:
        return (
            node.node_id in self._ids
            or node.node_name in self._names
            or node.node_manager_address in self._ips
            or node.is_head_node in self._head
        )
