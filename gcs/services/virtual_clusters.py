"""``ray.rpc.VirtualClusterInfoGcsService`` (ant-ray): all eight RPCs.

ant-ray answers every outcome with gRPC OK and a ``GcsStatus`` in the reply (code + bare
message); a ``VcError`` becomes that status plus its payload. Only a store outage is a gRPC
error (UNAVAILABLE, from ``Unavailable``): nothing was changed and the client may retry.
"""

from __future__ import annotations

from typing import Any

from gcs.managers.virtual_clusters import VirtualClusterManager
from gcs.proto import virtual_cluster_pb2
from gcs.virtual_clusters import VcError
from gcs.virtual_clusters.convert import node_instances_proto, status_proto

V = virtual_cluster_pb2


class VirtualClusterInfoServicer:
    def __init__(self, manager: VirtualClusterManager) -> None:
        self._m = manager

    async def CreateOrUpdateVirtualCluster(
        self, request: V.CreateOrUpdateVirtualClusterRequest, context: Any
    ) -> V.CreateOrUpdateVirtualClusterReply:
        try:
            result = await self._m.create_or_update(
                request.virtual_cluster_id,
                request.divisible,
                dict(request.replica_sets),
                request.revision,
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
            await self._m.remove_nodes(request.virtual_cluster_id, list(request.nodes_to_remove))
        except VcError as err:
            return V.RemoveNodesFromVirtualClusterReply(
                status=status_proto(err), nodes_with_failure=err.nodes_with_failure
            )
        return V.RemoveNodesFromVirtualClusterReply(status=status_proto())

    async def RemoveVirtualCluster(
        self, request: V.RemoveVirtualClusterRequest, context: Any
    ) -> V.RemoveVirtualClusterReply:
        try:
            await self._m.remove(request.virtual_cluster_id)
        except VcError as err:
            return V.RemoveVirtualClusterReply(status=status_proto(err))
        return V.RemoveVirtualClusterReply(status=status_proto())

    async def GetVirtualClusters(
        self, request: V.GetVirtualClustersRequest, context: Any
    ) -> V.GetVirtualClustersReply:
        found = self._m.registry.get_virtual_clusters(
            request.virtual_cluster_id,
            request.include_job_clusters,
            request.only_include_indivisible_clusters,
        )
        return V.GetVirtualClustersReply(status=status_proto(), virtual_cluster_data_list=found)

    async def CreateJobCluster(
        self, request: V.CreateJobClusterRequest, context: Any
    ) -> V.CreateJobClusterReply:
        try:
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
        return V.GetAllVirtualClusterInfoReply(
            status=status_proto(), virtual_clusters_view=views, total=total
        )

    async def UpdateAutoscalingConfig(
        self, request: V.UpdateAutoscalingConfigRequest, context: Any
    ) -> V.UpdateAutoscalingConfigReply:
        try:
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
            cluster = self._m.registry.get_autoscaling_config(request.virtual_cluster_id)
        except VcError as err:
            return V.GetAutoscalingConfigReply(status=status_proto(err))
        reply = V.GetAutoscalingConfigReply(status=status_proto(), max_nodes=cluster.max_nodes)
        reply.min_replica_sets.update(cluster.min_replica_sets)
        reply.max_replica_sets.update(cluster.max_replica_sets)
        return reply
