"""grpc health, reflection and the Prometheus endpoint are on."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
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
                assert "ray.rpc.NodeInfoGcsService" in names
                assert not [n for n in names if n.startswith("gcs.")], names
                assert "grpc.health.v1.Health" in names
                s = Stubs(ch, server.meta.cluster_id)
                await s.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest())
            url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30).read())
            text = body.decode()
            assert (
                'gcs_rpc_total{code="OK",method="/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"}'
                in text
            )
            assert "gcs_load_poll_round_seconds" in text
        finally:
            await server.stop()


class TestReflectionServesWireNames:
    async def test_listed_services_resolve_and_are_callable_by_name(self) -> None:
        """Every listed service resolves through a reflection client (what grpcurl does),
        and GetClusterId called by its reflected name answers with the cluster id."""
        from google.protobuf.descriptor_pool import DescriptorPool
        from google.protobuf.message_factory import GetMessageClass
        from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
            ProtoReflectionDescriptorDatabase,
        )

        server = GcsServer(fast_config(), store=MemoryStore())
        await server.start()
        try:

            def probe() -> tuple[list[str], bytes]:
                with grpc.insecure_channel(server.address) as channel:
                    db = ProtoReflectionDescriptorDatabase(channel)
                    pool = DescriptorPool(db)
                    names = list(db.get_services())
                    for name in names:
                        pool.FindServiceByName(name)  # raises if it does not resolve
                    service = pool.FindServiceByName("ray.rpc.NodeInfoGcsService")
                    method = service.methods_by_name["GetClusterId"]
                    request = GetMessageClass(method.input_type)()
                    reply_cls = GetMessageClass(method.output_type)
                    call = channel.unary_unary(
                        f"/{service.full_name}/{method.name}",
                        request_serializer=lambda m: m.SerializeToString(),
                        response_deserializer=reply_cls.FromString,
                    )
                    reply = call(request, timeout=10)
                    return names, reply.cluster_id

            names, cluster_id = await asyncio.to_thread(probe)
        finally:
            await server.stop()
        assert "ray.rpc.autoscaler.AutoscalerStateService" in names
        assert "ray.rpc.NodeInfoGcsService" in names
        assert all(n.startswith(("ray.rpc.", "grpc.")) for n in names), names
        assert cluster_id == server.meta.cluster_id


class TestMetricTypes:
    async def test_counters_process_collectors_and_virtual_clusters(self) -> None:
        """Monotonic figures are counters (*_total), the process/Python collectors are on
        the server's registry, and virtual clusters are counted with their nodes."""
        from prometheus_client.parser import text_string_to_metric_families

        from gcs.proto import common_pb2

        server = GcsServer(fast_config(metrics_port=0), store=MemoryStore())
        await server.start()
        try:
            assert server.managers is not None
            await server.managers.placement_groups.create(
                common_pb2.PlacementGroupSpec(
                    placement_group_id=b"p" * 18,
                    bundles=[common_pb2.Bundle(unit_resources={"GPU": 1})],
                )
            )
            url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30).read())
        finally:
            await server.stop()
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        for name in (
            "gcs_load_poll_ok",
            "gcs_load_poll_failures",
            "gcs_health_check_failures",
            "gcs_pubsub_published",
            "gcs_syncer_messages",
        ):
            assert families[name].type == "counter", name
        outcomes = {s.labels["outcome"] for s in families["gcs_syncer_messages"].samples}
        assert {"accepted", "stale", "relayed", "coalesced"} <= outcomes
        assert families["gcs_syncer_streams"].samples[0].value == 0
        text = body.decode()
        assert "gcs_load_poll_ok_total 0.0" in text
        assert "process_cpu_seconds_total" in text
        assert "python_gc_collections_total" in text
        assert "python_info" in text
        assert families["gcs_virtual_clusters"].type == "gauge"
        actors = {s.labels["state"]: s.value for s in families["gcs_actors"].samples}
        assert actors == dict.fromkeys(
            ["DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING", "DEAD"], 0
        )
        primary = [
            s
            for s in families["gcs_virtual_cluster_nodes"].samples
            if s.labels["virtual_cluster"] == "kPrimaryClusterID"
        ]
        assert primary and primary[0].value == 0
        [pending] = families["gcs_placement_groups"].samples
        assert pending.labels == {"state": "PENDING"} and pending.value == 1
        subscribers = families["gcs_pubsub_subscribers"].samples
        assert {s.labels["publisher"] for s in subscribers} == {"control_plane", "observability"}


class TestScrapeThread:
    async def test_sources_are_read_on_the_event_loop(self) -> None:
        """The HTTP endpoint scrapes from its own thread; manager state is read on the loop
        that owns it (reading dicts from another thread can fail mid-iteration)."""
        import threading

        from gcs.server.metrics import on_loop

        seen: list[int] = []

        def source() -> list:
            seen.append(threading.get_ident())
            return []

        collect = on_loop(asyncio.get_running_loop(), source)
        await asyncio.to_thread(collect)  # a scrape thread
        collect()  # on the loop itself: no deadlock
        assert seen == [threading.get_ident()] * 2


async def test_store_operations_are_timed_and_failures_counted_by_meaning() -> None:
    """gcs_store_*: latency per op, and failures by what they mean for a client."""
    from prometheus_client import generate_latest

    from gcs.server import GcsServer
    from gcs.store import StoreUnavailable
    from gcs.store.memory import MemoryStore
    from tests.conftest import fast_config

    store = MemoryStore()
    server = GcsServer(fast_config(), store=store)
    await server.start()
    try:
        assert server.managers is not None
        await server.managers.kv.put(b"ns", b"k", b"v", overwrite=True)
        store.fail_writes = True
        with pytest.raises(StoreUnavailable):
            await server.managers.kv.put(b"ns", b"k2", b"v", overwrite=True)
        text = generate_latest(server.metrics.registry).decode()
        assert 'gcs_store_op_seconds_count{op="write"}' in text
        assert 'gcs_store_failures_total{op="write",outcome="unavailable"} 1.0' in text
    finally:
        store.fail_writes = False
        await server.stop()
