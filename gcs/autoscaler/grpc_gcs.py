"""The autoscaler's GCS calls (:mod:`gcs.autoscaler.gcs_api`) over one gRPC channel.

The same AutoscalerStateService serves the embedded autoscaler and a standalone one (ours or
Ray 2.60's GCS), so this client speaks only Ray's wire protocol.  Failures are raised as
:class:`~gcs.base.errors.Unavailable`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import grpc

from gcs.autoscaler.gcs_api import DrainResult, VcSnapshot, VcUpdate
from gcs.base.errors import Unavailable
from gcs.proto import autoscaler_pb2, gcs_service_pb2, virtual_cluster_pb2
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import (
    AUTOSCALER_STATE,
    INTERNAL_KV,
    JOB_INFO,
    NODE_INFO,
    VIRTUAL_CLUSTER_INFO,
)


class GrpcAutoscalerGcs:
    """``AutoscalerGcs`` and ``ProviderGcs`` (:mod:`gcs.autoscaler.gcs_api`) over one
    channel; learns the cluster id on first use.

    Virtual-cluster moves go through the GCS's lane and revision rule: a release carries the
    revision of that cluster this adapter last saw (in GetClusterResourceState,
    GetVirtualClusters or its own update's reply), so a cluster changed since the autoscaler
    planned on it is not shrunk (the release fails as expired; the next round re-plans).
    Both moves are flagged ``autoscaler_move`` (a GCS of ours keeps the declared replica sets
    and the floor; ant-ray's skips the field)."""

    def __init__(self, channel: grpc.aio.Channel, *, timeout_s: float = 10.0) -> None:
        self._channel = channel
        self._timeout_s = timeout_s
        self._vc_revisions: dict[str, int] = {}
        self._node_info = ServiceStub(channel, NODE_INFO, timeout_s=timeout_s)
        self._autoscaler: ServiceStub | None = None
        self._kv: ServiceStub | None = None
        self._jobs: ServiceStub | None = None
        self._vc: ServiceStub | None = None

    async def _stub(self) -> ServiceStub:
        if self._autoscaler is None:
            try:
                cid = await self._node_info.GetClusterId(gcs_service_pb2.GetClusterIdRequest())
            except grpc.aio.AioRpcError as err:
                raise Unavailable(f"GCS unreachable: {err.details()}") from None
            md = [("ray_cluster_id", cid.cluster_id.hex())]
            self._node_info.set_metadata(md)
            self._autoscaler = ServiceStub(
                self._channel, AUTOSCALER_STATE, metadata=md, timeout_s=self._timeout_s
            )
            self._kv = ServiceStub(
                self._channel, INTERNAL_KV, metadata=md, timeout_s=self._timeout_s
            )
            self._jobs = ServiceStub(
                self._channel, JOB_INFO, metadata=md, timeout_s=self._timeout_s
            )
            self._vc = ServiceStub(
                self._channel, VIRTUAL_CLUSTER_INFO, metadata=md, timeout_s=self._timeout_s
            )
        return self._autoscaler

    async def _call(self, name: str, request: object) -> object:
        stub = await self._stub()
        try:
            return await getattr(stub, name)(request)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAUTHENTICATED:
                self._autoscaler = None  # GCS restarted with a new cluster id: re-learn it
            raise Unavailable(f"{name} failed: {err.code().name} {err.details()}") from None

    async def get_cluster_resource_state(self) -> autoscaler_pb2.ClusterResourceState:
        reply = await self._call(
            "GetClusterResourceState", autoscaler_pb2.GetClusterResourceStateRequest()
        )
        state: autoscaler_pb2.ClusterResourceState = reply.cluster_resource_state  # type: ignore[attr-defined]
        self._vc_revisions = {cid: vc.revision for cid, vc in state.virtual_cluster_states.items()}
        return state

    async def report_autoscaling_state(self, state: autoscaler_pb2.AutoscalingState) -> None:
        await self._call(
            "ReportAutoscalingState",
            autoscaler_pb2.ReportAutoscalingStateRequest(autoscaling_state=state),
        )

    async def resize_raylet(
        self, node_id_hex: str, resources: Mapping[str, float]
    ) -> dict[str, float]:
        """``ResizeRayletResourceInstances``: the raylet's totals after the resize."""
        reply = await self._call(
            "ResizeRayletResourceInstances",
            autoscaler_pb2.ResizeRayletResourceInstancesRequest(
                node_id=bytes.fromhex(node_id_hex), resources=dict(resources)
            ),
        )
        return dict(reply.total_resources)  # type: ignore[attr-defined]

    async def live_drivers(self) -> int:
        """Drivers alive now, Ray's internal ones (``_ray_internal_`` namespaces) not counted."""
        await self._stub()
        assert self._jobs is not None
        try:
            reply = await self._jobs.GetAllJobInfo(
                gcs_service_pb2.GetAllJobInfoRequest(
                    skip_submission_job_info_field=True, skip_is_running_tasks_field=True
                )
            )
        except grpc.aio.AioRpcError as err:
            raise Unavailable(f"GetAllJobInfo failed: {err.code().name} {err.details()}") from None
        return sum(
            1
            for job in reply.job_info_list
            if not job.is_dead and not job.config.ray_namespace.startswith("_ray_internal_")
        )

    async def drain_idle(self, node_id_hex: str, message: str) -> DrainResult:
        reply = await self._call(
            "DrainNode",
            autoscaler_pb2.DrainNodeRequest(
                node_id=bytes.fromhex(node_id_hex),
                reason=autoscaler_pb2.DRAIN_NODE_REASON_IDLE_TERMINATION,
                reason_message=message,
                deadline_timestamp_ms=0,
            ),
        )
        return DrainResult(reply.is_accepted, reply.rejection_reason_message)  # type: ignore[attr-defined]

    async def stop_node(self, node_id_hex: str) -> bool:
        await self._stub()
        request = gcs_service_pb2.DrainNodeRequest()
        request.drain_node_data.add(node_id=bytes.fromhex(node_id_hex))
        try:
            reply = await self._node_info.DrainNode(request)
        except grpc.aio.AioRpcError as err:
            raise Unavailable(f"DrainNode failed: {err.code().name} {err.details()}") from None
        return len(reply.drain_node_status) > 0

    # -- InternalKV (instance storage and the event log of a standalone autoscaler) --------
    async def _kv_call(self, name: str, request: object) -> object:
        await self._stub()
        assert self._kv is not None
        try:
            return await getattr(self._kv, name)(request)
        except grpc.aio.AioRpcError as err:
            raise Unavailable(f"{name} failed: {err.code().name} {err.details()}") from None

    async def get(self, namespace: bytes, key: bytes) -> bytes | None:
        reply = await self._kv_call(
            "InternalKVGet", gcs_service_pb2.InternalKVGetRequest(namespace=namespace, key=key)
        )
        if reply.status.code == 17:  # type: ignore[attr-defined]  # NotFound
            return None
        return reply.value  # type: ignore[attr-defined,no-any-return]

    async def put(self, namespace: bytes, key: bytes, value: bytes) -> None:
        reply = await self._kv_call(
            "InternalKVPut",
            gcs_service_pb2.InternalKVPutRequest(
                namespace=namespace, key=key, value=value, overwrite=True
            ),
        )
        if reply.status.code != 0:  # type: ignore[attr-defined]
            raise Unavailable(f"InternalKVPut failed: {reply.status.message}")  # type: ignore[attr-defined]

    async def _vc_call(self, name: str, request: object) -> object:
        await self._stub()
        assert self._vc is not None
        try:
            return await getattr(self._vc, name)(request)
        except grpc.aio.AioRpcError as err:
            raise Unavailable(f"{name} failed: {err.code().name} {err.details()}") from None

    async def release_nodes(self, cluster_id: str, node_ids_hex: list[str]) -> None:
        reply = await self._vc_call(
            "RemoveNodesFromVirtualCluster",
            virtual_cluster_pb2.RemoveNodesFromVirtualClusterRequest(
                virtual_cluster_id=cluster_id,
                nodes_to_remove=node_ids_hex,
                revision=self._vc_revisions.get(cluster_id, 0),
                autoscaler_move=True,
            ),
        )
        status = reply.status  # type: ignore[attr-defined]
        if status.code != 0:
            raise Unavailable(f"RemoveNodesFromVirtualCluster({cluster_id}): {status.message}")

    async def read_virtual_cluster(self, cluster_id: str) -> VcSnapshot | None:
        reply = await self._vc_call(
            "GetVirtualClusters",
            virtual_cluster_pb2.GetVirtualClustersRequest(virtual_cluster_id=cluster_id),
        )
        for data in reply.virtual_cluster_data_list:  # type: ignore[attr-defined]
            if data.id == cluster_id:
                self._vc_revisions[cluster_id] = data.revision
                return VcSnapshot(
                    revision=data.revision,
                    divisible=data.divisible,
                    replica_sets=dict(Counter(n.template_id for n in data.node_instances.values())),
                    nodes=frozenset(data.node_instances),
                )
        return None

    async def update_virtual_cluster(
        self, cluster_id: str, *, divisible: bool, replica_sets: Mapping[str, int], revision: int
    ) -> VcUpdate:
        reply = await self._vc_call(
            "CreateOrUpdateVirtualCluster",
            virtual_cluster_pb2.CreateOrUpdateVirtualClusterRequest(
                virtual_cluster_id=cluster_id,
                divisible=divisible,
                replica_sets=dict(replica_sets),
                revision=revision,
                autoscaler_move=True,
            ),
        )
        status = reply.status  # type: ignore[attr-defined]
        if status.code == 0:
            self._vc_revisions[cluster_id] = reply.revision  # type: ignore[attr-defined]
            return VcUpdate(True, nodes=frozenset(reply.node_instances))  # type: ignore[attr-defined]
        return VcUpdate(False, expired="is expired" in status.message, message=status.message)
