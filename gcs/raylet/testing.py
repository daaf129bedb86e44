"""A small fake GCS for tests and benchmarks: NodeInfoGcsService only, recording calls.

Every call it answers notifies :attr:`FakeGcs.changes`, so a test waits for the calls it
expects (``await fake_gcs.changes.until(...)``), not for time."""

from __future__ import annotations

import os
from typing import Any

import grpc

from gcs.base.changes import Changes
from gcs.proto import gcs_pb2, gcs_service_pb2
from gcs.rpc import service_handler
from gcs.rpc.descriptors import NODE_INFO


class FakeNodeInfo:
    """Records RegisterNode / UnregisterNode / CheckAlive; enforces the cluster id."""

    def __init__(self, cluster_id: bytes, changes: Changes | None = None) -> None:
        self.cluster_id = cluster_id
        self.changes = changes or Changes()
        self.registered: list[gcs_pb2.GcsNodeInfo] = []
        self.unregistered: list[gcs_service_pb2.UnregisterNodeRequest] = []
        self.check_alive_calls: list[list[bytes]] = []
        self.register_metadata: list[dict[str, str]] = []
        self.dead: set[bytes] = set()
        self.nodes: dict[bytes, gcs_pb2.GcsNodeInfo] = {}

    async def _check_cluster(self, context: Any) -> dict[str, str]:
        md = {k: v for k, v in context.invocation_metadata() or ()}
        got = md.get("ray_cluster_id")
        if got is not None and got != self.cluster_id.hex():
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "WrongClusterID: Perhaps the client is accessing GCS after it has restarted.",
            )
        return md

    async def GetClusterId(self, request: Any, context: Any) -> Any:
        await self._check_cluster(context)
        return gcs_service_pb2.GetClusterIdReply(cluster_id=self.cluster_id)

    async def RegisterNode(self, request: Any, context: Any) -> Any:
        self.register_metadata.append(await self._check_cluster(context))
        info = request.node_info
        self.registered.append(info)
        self.nodes[info.node_id] = info
        self.dead.discard(info.node_id)
        self.changes.notify()
        return gcs_service_pb2.RegisterNodeReply()

    async def UnregisterNode(self, request: Any, context: Any) -> Any:
        await self._check_cluster(context)
        self.unregistered.append(request)
        self.dead.add(request.node_id)
        self.changes.notify()
        return gcs_service_pb2.UnregisterNodeReply()

    async def CheckAlive(self, request: Any, context: Any) -> Any:
        await self._check_cluster(context)
        ids = list(request.node_ids)
        self.check_alive_calls.append(ids)
        self.changes.notify()
        return gcs_service_pb2.CheckAliveReply(
            ray_version="2.60.0",
            raylet_alive=[i in self.nodes and i not in self.dead for i in ids],
            is_leader=True,
        )

    async def GetAllNodeInfo(self, request: Any, context: Any) -> Any:
        await self._check_cluster(context)
        alive = [n for i, n in self.nodes.items() if i not in self.dead]
        return gcs_service_pb2.GetAllNodeInfoReply(node_info_list=alive, total=len(self.nodes))


class FakeGcs:
    """Start/stop/restart on a fixed port; ``restart(new_cluster=True)`` is a fresh GCS."""

    def __init__(self, cluster_id: bytes | None = None) -> None:
        self.changes = Changes()
        """Notified on every call answered, by this GCS or its restarted successors."""
        self.servicer = FakeNodeInfo(cluster_id or os.urandom(28), self.changes)
        self.port = 0
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((service_handler(NODE_INFO, self.servicer),))
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def restart(self, *, new_cluster: bool = False) -> None:
        await self.stop()
        if new_cluster:
            self.servicer = FakeNodeInfo(os.urandom(28), self.changes)
        await self.start()
