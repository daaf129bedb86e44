"""Client for ``VirtualClusterInfoGcsService`` (async, plus sync one-shot wrappers).

A non-OK ``GcsStatus`` becomes ``VirtualClusterCallError`` carrying ant-ray's code, message
and payloads (recommended replica sets, failed node ids).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from gcs.proto import virtual_cluster_pb2
from gcs.proto.virtual_cluster_data_pb2 import VirtualClusterTableData
from gcs.rpc.client import ServiceStub
from gcs.rpc.descriptors import VIRTUAL_CLUSTER_INFO
from gcs.rpc.security import Security

V = virtual_cluster_pb2


class VirtualClusterCallError(Exception):
    def __init__(
        self,
        code: int,
        message: str,
        *,
        replica_sets_to_recommend: Mapping[str, int] | None = None,
        nodes_with_failure: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.replica_sets_to_recommend = dict(replica_sets_to_recommend or {})
        self.nodes_with_failure = list(nodes_with_failure or [])


@dataclass(frozen=True)
class Applied:
    """Outcome of a successful create/update."""

    revision: int
    node_instances: dict[str, tuple[str, str]] = field(default_factory=dict)
    """node id -> (hostname, template id)."""


def _check(reply: Any, **payload: Any) -> None:
    if reply.status.code != 0:
        raise VirtualClusterCallError(reply.status.code, reply.status.message, **payload)


class VirtualClusterClient:
    """``async with VirtualClusterClient("host:port") as vc: await vc.list()``."""

    def __init__(self, address: str, *, timeout_s: float = 10.0) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: ServiceStub | None = None

    async def __aenter__(self) -> VirtualClusterClient:
        self._channel = Security.from_env().aio_channel(self.address)
        self._stub = ServiceStub(self._channel, VIRTUAL_CLUSTER_INFO, timeout_s=self._timeout_s)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._channel is not None:
            await self._channel.close()

    @property
    def stub(self) -> ServiceStub:
        assert self._stub is not None, "use 'async with'"
        return self._stub

    async def create_or_update(
        self,
        cluster_id: str,
        *,
        divisible: bool = False,
        replica_sets: Mapping[str, int] | None = None,
        revision: int = 0,
        must_exist: bool = False,
    ) -> Applied:
        """ant-ray's create-or-update; ``must_exist``: an update, NotFound (code 17) when
        the cluster does not exist instead of creating it (a gcs extension)."""
        reply = await self.stub.CreateOrUpdateVirtualCluster(
            V.CreateOrUpdateVirtualClusterRequest(
                virtual_cluster_id=cluster_id,
                divisible=divisible,
                replica_sets=dict(replica_sets or {}),
                revision=revision,
                must_exist=must_exist,
            )
        )
        _check(reply, replica_sets_to_recommend=dict(reply.replica_sets_to_recommend))
        return Applied(
            reply.revision,
            {k: (v.hostname, v.template_id) for k, v in sorted(reply.node_instances.items())},
        )

    async def remove(self, cluster_id: str) -> None:
        reply = await self.stub.RemoveVirtualCluster(
            V.RemoveVirtualClusterRequest(virtual_cluster_id=cluster_id)
        )
        _check(reply)

    async def remove_nodes(self, cluster_id: str, node_ids: list[str]) -> None:
        reply = await self.stub.RemoveNodesFromVirtualCluster(
            V.RemoveNodesFromVirtualClusterRequest(
                virtual_cluster_id=cluster_id, nodes_to_remove=node_ids
            )
        )
        _check(reply, nodes_with_failure=list(reply.nodes_with_failure))

    async def list(
        self,
        cluster_id: str = "",
        *,
        include_job_clusters: bool = False,
        only_indivisible: bool = False,
    ) -> list[VirtualClusterTableData]:
        reply = await self.stub.GetVirtualClusters(
            V.GetVirtualClustersRequest(
                virtual_cluster_id=cluster_id,
                include_job_clusters=include_job_clusters,
                only_include_indivisible_clusters=only_indivisible,
            )
        )
        _check(reply)
        return list(reply.virtual_cluster_data_list)

    async def get(self, cluster_id: str) -> VirtualClusterTableData | None:
        found = [c for c in await self.list(cluster_id) if c.id == cluster_id]
        return found[0] if found else None

    async def show(
        self, limit: int | None = None
    ) -> tuple[builtins.list[V.VirtualClusterView], int]:  # `list` is a method here
        request = V.GetAllVirtualClusterInfoRequest()
        if limit is not None:
            request.limit = limit
        reply = await self.stub.GetAllVirtualClusterInfo(request)
        _check(reply)
        return list(reply.virtual_clusters_view), reply.total


# -- sync one-shot wrappers ------------------------------------------------------------------
def _sync(address: str, method: str, *args: Any, **kwargs: Any) -> Any:
    async def call() -> Any:
        async with VirtualClusterClient(address) as client:
            return await getattr(client, method)(*args, **kwargs)

    return asyncio.run(call())


def create_or_update(address: str, cluster_id: str, **kwargs: Any) -> Applied:
    return _sync(address, "create_or_update", cluster_id, **kwargs)


def remove(address: str, cluster_id: str) -> None:
    _sync(address, "remove", cluster_id)


def list_clusters(address: str, cluster_id: str = "", **kwargs: Any) -> list:
    return _sync(address, "list", cluster_id, **kwargs)


def get(address: str, cluster_id: str) -> VirtualClusterTableData | None:
    return _sync(address, "get", cluster_id)


def show(address: str, limit: int | None = None) -> tuple[list, int]:
    return _sync(address, "show", limit)
