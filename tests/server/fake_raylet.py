"""A minimal in-test raylet: serves GetResourceLoad / DrainRaylet / Resize / bundle 2PC +
health."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gcs.base.changes import Changes
from gcs.proto import gcs_pb2, node_manager_pb2
from gcs.rpc import service_handler
from gcs.rpc.descriptors import NODE_MANAGER


class FakeRaylet:
    def __init__(self, resources: dict[str, float], node_type: str = "cpu") -> None:
        self.node_id = os.urandom(28)
        self.resources = dict(resources)
        self.node_type = node_type
        self.load: gcs_pb2.ResourcesData | None = None
        self.drain_accept = True
        self.drain_reply_lost = False
        """When True, DrainRaylet never answers (a raylet that exited before its reply went
        out)."""
        self.drains: list[Any] = []
        self.polls = 0
        self.notified = 0
        self.port = 0
        self.gate: asyncio.Event | None = None
        """When set, GetResourceLoad and NotifyGCSRestart wait for it (calls held open)."""
        self.in_flight = 0
        self.max_in_flight = 0
        self.committed: list[tuple[bytes, int]] = []
        """Bundles committed here (placement group id, index); no resource accounting."""
        self._server: grpc.aio.Server | None = None
        self.changes = Changes()
        """Notified on every call received and when a held call ends."""

    async def _held(self) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.changes.notify()
        try:
            if self.gate is not None:
                await self.gate.wait()
        finally:
            self.in_flight -= 1
            self.changes.notify()

    async def GetResourceLoad(self, request: Any, context: Any) -> Any:
        self.polls += 1
        await self._held()
        data = gcs_pb2.ResourcesData(
            node_id=self.node_id,
            resources_total=self.resources,
            resources_available=self.resources,
            draining_deadline_timestamp_ms=-1,
        )
        if self.load is not None:
            data.MergeFrom(self.load)
        return node_manager_pb2.GetResourceLoadReply(resources=data)

    async def DrainRaylet(self, request: Any, context: Any) -> Any:
        self.drains.append(request)
        self.changes.notify()
        if self.drain_reply_lost:
            await asyncio.Event().wait()
        if self.drain_accept:
            return node_manager_pb2.DrainRayletReply(is_accepted=True)
        return node_manager_pb2.DrainRayletReply(
            is_accepted=False, rejection_reason_message="busy: 1 lease running"
        )

    async def ResizeLocalResourceInstances(self, request: Any, context: Any) -> Any:
        if "GPU" in request.resources:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "GPU cannot be resized")
        self.resources.update(request.resources)
        return node_manager_pb2.ResizeLocalResourceInstancesReply(total_resources=self.resources)

    async def PrepareBundleResources(self, request: Any, context: Any) -> Any:
        return node_manager_pb2.PrepareBundleResourcesReply(success=True)

    async def CommitBundleResources(self, request: Any, context: Any) -> Any:
        for b in request.bundle_specs:
            self.committed.append((b.bundle_id.placement_group_id, b.bundle_id.bundle_index))
        self.changes.notify()
        return node_manager_pb2.CommitBundleResourcesReply()

    async def NotifyGCSRestart(self, request: Any, context: Any) -> Any:
        self.notified += 1
        await self._held()
        return node_manager_pb2.NotifyGCSRestartReply()

    async def start(self, port: int = 0) -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([service_handler(NODE_MANAGER, self)])
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        await servicer.set(self.node_id.hex(), health_pb2.HealthCheckResponse.SERVING)
        self.port = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)

    def node_info(self, **overrides: Any) -> gcs_pb2.GcsNodeInfo:
        info = gcs_pb2.GcsNodeInfo(
            node_id=self.node_id,
            node_manager_address="127.0.0.1",
            node_manager_port=self.port,
            object_manager_port=self.port,
            resources_total=self.resources,
            node_type_name=self.node_type,
            instance_id=f"i-{self.node_id.hex()[:8]}",
            labels={"ray.io/node-id": self.node_id.hex()},
            state=gcs_pb2.GcsNodeInfo.ALIVE,
        )
        for key, value in overrides.items():
            setattr(info, key, value)
        return info
