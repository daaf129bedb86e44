"""``ray.rpc.VirtualClusterInfoGcsService`` (ant-ray): all eight RPCs.

ant-ray answers every outcome with gRPC OK and a ``GcsStatus`` in the reply (code + bare
message); a ``VcError`` becomes that status plus its payload. Only a store outage is a gRPC
error (UNAVAILABLE, from ``Unavailable``): nothing was changed and the client may retry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gcs.base.errors import InvalidArgument
from gcs.config import RequestLimits
from gcs.managers.virtual_clusters import VirtualClusterManager
from gcs.policy.virtual_clusters import VcError
from gcs.policy.virtual_clusters.convert import node_instances_proto, status_proto
from gcs.policy.virtual_clusters.errors import VcInvalidArgument
from gcs.proto import virtual_cluster_pb2
from gcs.services import validate
from gcs.services.common import ReplySize

V = virtual_cluster_pb2


class VirtualClusterInfoServicer:
    def __init__(self, manager: VirtualClusterManager, *, limits: RequestLimits) -> None:
        self._m = manager
        self._limits = limits

    def _check(
        self,
        cluster_id: str,
        *,
        replica_sets: Mapping[str, Mapping[str, int]] | None = None,
        names: Mapping[str, Sequence[str]] | None = None,
        texts: Mapping[str, str] | None = None,
        counts: Mapping[str, int] | None = None,
    ) -> None:
        """Bounded ids, template ids and node lists; a violation is ant-ray's in-reply
        InvalidArgument status (``VcInvalidArgument``) naming the field."""
        lim = self._limits
        try:
            validate.text(cluster_id, "virtual_cluster_id", lim.max_name_bytes)
            for field, replicas in (replica_sets or {}).items():
                validate.entries(list(replicas), field, lim.max_map_entries)
                for template in replicas:
                    validate.text(template, f"{field} template id", lim.max_name_bytes)
            for field, count in (counts or {}).items():
                validate.non_negative(count, field)
            for field, value in (texts or {}).items():
                validate.text(value, field, lim.max_name_bytes)
            for field, values in (names or {}).items():
                validate.entries(values, field, lim.max_repeated_entries)
                for i, value in enumerate(values):
                    validate.text(value, f"{field}[{i}]", lim.max_name_bytes)
        except InvalidArgument as err:
            raise VcInvalidArgument(f"Invalid request, {err.message}") from None

    async def CreateOrUpdateVirtualCluster(
        self, request: V.CreateOrUpdateVirtualClusterRequest, context: Any
    ) -> V.CreateOrUpdateVirtualClusterReply:
        try:
            self._check(
                request.virtual_cluster_id, replica_sets={"replica_sets": request.replica_sets}
            )
            result = await self._m.create_or_update(
                request.virtual_cluster_id,
                request.divisible,
                dict(request.replica_sets),
                request.revision,
                autoscaler=request.autoscaler_move,
                must_exist=request.must_exist,
            )
        except VcError as err:
            reply = V.CreateOrUpdateVirtualClusterReply(status=status_proto(err))
            reply.replica_sets_to_recommend.update(err.replica_sets_to_recommend)
            return reply
        reply = V.CreateOrUpdateVirtualClusterReply(status=status_proto(), revision=result.revision)
        for node_id, instance in node_instances_proto(
            result.cluster, self._m.registry.node
        ).items():
            reply.node_instances[node_id].CopyFrom(instance)
        return reply

    async def RemoveNodesFromVirtualCluster(
        self, request: V.RemoveNodesFromVirtualClusterRequest, context: Any
    ) -> V.RemoveNodesFromVirtualClusterReply:
        try:
            self._check(
                request.virtual_cluster_id, names={"nodes_to_remove": request.nodes_to_remove}
            )
            await self._m.remove_nodes(
                request.virtual_cluster_id,
                list(request.nodes_to_remove),
                revision=request.revision,
                autoscaler=request.autoscaler_move,
            )
        except VcError as err:
            return V.RemoveNodesFromVirtualClusterReply(
                status=status_proto(err), nodes_with_failure=err.nodes_with_failure
            )
        return V.RemoveNodesFromVirtualClusterReply(status=status_proto())

    async def RemoveVirtualCluster(
        self, request: V.RemoveVirtualClusterRequest, context: Any
    ) -> V.RemoveVirtualClusterReply:
        try:
            self._check(request.virtual_cluster_id)
            await self._m.remove(request.virtual_cluster_id)
        except VcError as err:
            return V.RemoveVirtualClusterReply(status=status_proto(err))
        return V.RemoveVirtualClusterReply(status=status_proto())

    async def GetVirtualClusters(
        self, request: V.GetVirtualClustersRequest, context: Any
    ) -> V.GetVirtualClustersReply:
        try:
            self._check(request.virtual_cluster_id)
        except VcError as err:
            return V.GetVirtualClustersReply(status=status_proto(err))
        found = self._m.registry.get_virtual_clusters(
            request.virtual_cluster_id,
            request.include_job_clusters,
            request.only_include_indivisible_clusters,
        )
        size = ReplySize(self._limits.max_reply_bytes, "virtual clusters")
        for data in found:
            size.add(data)
        return V.GetVirtualClustersReply(status=status_proto(), virtual_cluster_data_list=found)

    async def CreateJobCluster(
        self, request: V.CreateJobClusterRequest, context: Any
    ) -> V.CreateJobClusterReply:
        try:
            self._check(
                request.virtual_cluster_id,
                replica_sets={"replica_sets": request.replica_sets},
                texts={"job_id": request.job_id},
            )
            result = await self._m.create_job_cluster(
                request.virtual_cluster_id, request.job_id, dict(request.replica_sets)
            )
        except VcError as err:
            # ant-ray never fills replica_sets_to_recommend here (quirk Q2).
            return V.CreateJobClusterReply(status=status_proto(err))
        return V.CreateJobClusterReply(status=status_proto(), job_cluster_id=result.job_cluster_id)

    async def GetAllVirtualClusterInfo(
        self, request: V.GetAllVirtualClusterInfoRequest, context: Any
    ) -> V.GetAllVirtualClusterInfoReply:
        limit = request.limit if request.HasField("limit") else None
        views, total = self._m.registry.all_views(limit, self._m.resources_of)
        size = ReplySize(self._limits.max_reply_bytes, "virtual clusters")
        for view in views:
            size.add(view)
        return V.GetAllVirtualClusterInfoReply(
            status=status_proto(), virtual_clusters_view=views, total=total
        )

    async def UpdateAutoscalingConfig(
        self, request: V.UpdateAutoscalingConfigRequest, context: Any
    ) -> V.UpdateAutoscalingConfigReply:
        try:
            self._check(
                request.virtual_cluster_id,
                replica_sets={
                    "min_replica_sets": request.min_replica_sets,
                    "max_replica_sets": request.max_replica_sets,
                },
                counts={
                    "max_nodes": request.max_nodes,
                    **{f"min_replica_sets[{k}]": v for k, v in request.min_replica_sets.items()},
                    **{f"max_replica_sets[{k}]": v for k, v in request.max_replica_sets.items()},
                },
            )
            await self._m.update_autoscaling_config(
                request.virtual_cluster_id,
                dict(request.min_replica_sets),
                dict(request.max_replica_sets),
                request.max_nodes,
            )
        except VcError as err:
            return V.UpdateAutoscalingConfigReply(status=status_proto(err))
        return V.UpdateAutoscalingConfigReply(status=status_proto())

    async def GetAutoscalingConfig(
        self, request: V.GetAutoscalingConfigRequest, context: Any
    ) -> V.GetAutoscalingConfigReply:
        try:
            self._check(request.virtual_cluster_id)
            cluster = self._m.registry.get_autoscaling_config(request.virtual_cluster_id)
        except VcError as err:
            return V.GetAutoscalingConfigReply(status=status_proto(err))
        reply = V.GetAutoscalingConfigReply(status=status_proto(), max_nodes=cluster.max_nodes)
        reply.min_replica_sets.update(cluster.min_replica_sets)
        reply.max_replica_sets.update(cluster.max_replica_sets)
        return reply
