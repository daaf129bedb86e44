"""grpc health, reflection and the Prometheus endpoint are on."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gcs.proto import gcs_service_pb2 as G
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import Stubs, fast_config


class TestObservability:
    async def test_health_reflection_and_metrics(self) -> None:
        """Health answers SERVING for "" and Ray's service names; reflection lists them;
        /metrics exposes RPC counters after a call."""
        server = GcsServer(fast_config(metrics_port=0), store=MemoryStore())
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.address) as ch:
                health = health_pb2_grpc.HealthStub(ch)
                for name in (
                    "",
                    "ray.rpc.NodeInfoGcsService",
                    "ray.rpc.autoscaler.AutoscalerStateService",
                ):
                    reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
                refl = reflection_pb2_grpc.ServerReflectionStub(ch)

                async def requests():
                    yield reflection_pb2.ServerReflectionRequest(list_services="")

                names = set()
                async for response in refl.ServerReflectionInfo(requests()):
                    names |= {s.name for s in response.list_services_response.service}
                assert "gcs.rpc.NodeInfoGcsService" in names
                assert "grpc.health.v1.Health" in names
                s = Stubs(ch, server.meta.cluster_id)
                await s.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest())
            url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
            text = body.decode()
            assert (
                'gcs_rpc_total{code="OK",method="/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"}'
                in text
            )
            assert "gcs_load_poll_round_seconds" in text
        finally:
            await server.stop()
