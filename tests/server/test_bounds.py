"""Defect 8 (issue 12): unbounded fields.  Each bad value is refused with a message naming the
field, and nothing of it is stored, listed or published."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator

import grpc
import pytest

from gcs.config import RequestLimits
from gcs.proto import autoscaler_pb2 as A
from gcs.proto import common_pb2, gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.proto import virtual_cluster_pb2 as V
from gcs.rpc import ServiceStub
from gcs.rpc import descriptors as svc
from gcs.rpc.method_paths import method_path
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import Stubs, fast_config

MB = 1024 * 1024
LARGEST_PUT_DEADLINE_S = 120
"""The 511 MiB put's deadline.  Stubs' 30 s is sized for calls of kilobytes; this one moves
511 MiB through the test's one process (gRPC's copy, HTTP/2 frames parsed in Python, the
decode, the value): measured 23-40 s at load 10 on 2 cores (4 busy loops beside it), after
the server's two needless copies were cut (gcs.front.body).  It only bounds a hang."""
INVALID_ARGUMENT = 34  # Ray's StatusCode::InvalidArgument, in ant-ray's in-reply GcsStatus


def node(**kw: object) -> gcs_pb2.GcsNodeInfo:
    base: dict[str, object] = dict(
        node_id=b"\x02" * 28,
        node_manager_address="127.0.0.1",
        node_manager_port=1234,
        resources_total={"CPU": 1},
        state=gcs_pb2.GcsNodeInfo.ALIVE,
    )
    base.update(kw)
    return gcs_pb2.GcsNodeInfo(**base)  # type: ignore[arg-type]


def pg_spec(**unit_resources: float) -> common_pb2.PlacementGroupSpec:
    return common_pb2.PlacementGroupSpec(
        placement_group_id=b"\x03" * 18,
        bundles=[common_pb2.Bundle(unit_resources=unit_resources)],
        strategy=common_pb2.PACK,
    )


async def rejected(call: object, request: object) -> str:
    """Call and expect INVALID_ARGUMENT; return the details."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(request)  # type: ignore[operator]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    return err.value.details() or ""


@pytest.fixture
async def small_kv_server() -> AsyncIterator[GcsServer]:
    limits = RequestLimits(max_kv_value_bytes=1024, max_kv_key_bytes=64)
    server = GcsServer(fast_config(limits=limits), store=MemoryStore())
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


class TestNodeRegistration:
    async def test_megabyte_address_is_rejected_and_not_served(self, gcs_server, stubs) -> None:
        """A 1 MB node address was accepted and then sent in every GetClusterResourceState."""
        details = await rejected(
            stubs.node_info.RegisterNode,
            G.RegisterNodeRequest(node_info=node(node_manager_address="a" * MB)),
        )
        assert "node_info.node_manager_address" in details
        assert len(details) < 1000
        assert not gcs_server.managers.nodes.alive
        state = await stubs.autoscaler.GetClusterResourceState(A.GetClusterResourceStateRequest())
        assert not state.cluster_resource_state.node_states

    @pytest.mark.parametrize(
        "address",
        [
            "http://127.0.0.1",
            "127.0.0.1:8076",
            "127.0.0.1/raylet",
            "user@host",
            "a b",
            "host..name",
            "-host",
            "0.0.0.0",
            "224.0.0.1",
            "999.1.1.1",
            "é.example",
            "x" * 254,
        ],
    )
    async def test_garbage_addresses_are_rejected(self, gcs_server, stubs, address) -> None:
        """The GCS dials what a node registers: only IP literals and host names pass."""
        details = await rejected(
            stubs.node_info.RegisterNode,
            G.RegisterNodeRequest(node_info=node(node_manager_address=address)),
        )
        assert "node_info.node_manager_address" in details
        assert not gcs_server.managers.nodes.alive

    @pytest.mark.parametrize(
        ("info", "needle"),
        [
            (node(labels={"k" * 1000: "v"}), "node_info.labels key"),
            (node(labels={"ray.io/x": "v" * 1000}), "node_info.labels[ray.io/x]"),
            (node(labels={f"k{i}": "v" for i in range(300)}), "node_info.labels has 300"),
            (node(node_name="n" * 2000), "node_info.node_name"),
            (node(resources_total={"CPU": 1e300}), "node_info.resources_total[CPU]"),
            (node(resources_total={"r" * 2000: 1}), "node_info.resources_total resource name"),
            (node(object_store_socket_name="/" * MB), "node_info.object_store_socket_name"),
        ],
    )
    async def test_over_long_fields_are_rejected(self, gcs_server, stubs, info, needle) -> None:
        """Label keys/values, names and resource names have limits; the message names them."""
        details = await rejected(
            stubs.node_info.RegisterNode, G.RegisterNodeRequest(node_info=info)
        )
        assert needle in details
        assert not gcs_server.managers.nodes.alive

    async def test_a_valid_loopback_node_still_registers(self, gcs_server, stubs) -> None:
        """Limits leave real registrations alone (IPv6 literal, Ray-style labels)."""
        info = node(
            node_manager_address="::1",
            labels={"ray.io/node-id": "ab" * 28, "ray.io/accelerator-type": "A100"},
            resources_total={"CPU": 8, "memory": 64e9, "node:__internal_head__": 1},
        )
        await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=info))
        assert info.node_id in gcs_server.managers.nodes.alive


class TestPlacementGroups:
    @pytest.mark.parametrize("amount", [float("inf"), float("-inf"), float("nan"), -1.0, 1e300])
    async def test_non_finite_or_negative_bundle_is_rejected(
        self, gcs_server, stubs, amount
    ) -> None:
        """CPU=inf in a placement group was accepted (and then asked of the autoscaler)."""
        details = await rejected(
            stubs.pgs.CreatePlacementGroup,
            G.CreatePlacementGroupRequest(placement_group_spec=pg_spec(CPU=amount)),
        )
        assert "placement_group_spec.bundles[0].unit_resources[CPU]" in details
        assert not gcs_server.managers.placement_groups.groups

    async def test_over_long_label_selector_key_is_rejected(self, gcs_server, stubs) -> None:
        spec = pg_spec(CPU=1)
        spec.bundles[0].label_selector["k" * 1000] = "v"
        details = await rejected(
            stubs.pgs.CreatePlacementGroup,
            G.CreatePlacementGroupRequest(placement_group_spec=spec),
        )
        assert "placement_group_spec.bundles[0].label_selector key" in details
        assert not gcs_server.managers.placement_groups.groups

    async def test_megabyte_name_is_rejected(self, gcs_server, stubs) -> None:
        spec = pg_spec(CPU=1)
        spec.name = "p" * MB
        details = await rejected(
            stubs.pgs.CreatePlacementGroup,
            G.CreatePlacementGroupRequest(placement_group_spec=spec),
        )
        assert "placement_group_spec.name" in details


class TestVirtualClusters:
    async def test_megabyte_virtual_cluster_id_is_rejected(self, gcs_server) -> None:
        """A 1 MB VC id was accepted and then sent in every GetClusterResourceState."""
        async with grpc.aio.insecure_channel(gcs_server.address) as channel:
            vc = ServiceStub(channel, svc.VIRTUAL_CLUSTER_INFO, timeout_s=30)
            reply = await vc.CreateOrUpdateVirtualCluster(
                V.CreateOrUpdateVirtualClusterRequest(virtual_cluster_id="v" * MB, divisible=True)
            )
            assert reply.status.code == INVALID_ARGUMENT
            assert "virtual_cluster_id" in reply.status.message
            assert len(reply.status.message) < 1000
            listed = await vc.GetVirtualClusters(V.GetVirtualClustersRequest())
            assert not listed.virtual_cluster_data_list
            job = await vc.CreateJobCluster(
                V.CreateJobClusterRequest(virtual_cluster_id="kPrimaryClusterID", job_id="j" * MB)
            )
            assert job.status.code == INVALID_ARGUMENT and "job_id" in job.status.message

    async def test_over_long_template_id_is_rejected(self, gcs_server) -> None:
        async with grpc.aio.insecure_channel(gcs_server.address) as channel:
            vc = ServiceStub(channel, svc.VIRTUAL_CLUSTER_INFO, timeout_s=30)
            reply = await vc.CreateOrUpdateVirtualCluster(
                V.CreateOrUpdateVirtualClusterRequest(
                    virtual_cluster_id="vc1", divisible=True, replica_sets={"t" * 600: 1}
                )
            )
            assert reply.status.code == INVALID_ARGUMENT
            assert "replica_sets template id" in reply.status.message

    async def test_job_with_megabyte_virtual_cluster_id_is_rejected(self, gcs_server, stubs):
        job = gcs_pb2.JobTableData(job_id=b"\x01\x00\x00\x00", virtual_cluster_id="v" * MB)
        details = await rejected(stubs.jobs.AddJob, G.AddJobRequest(data=job))
        assert "data.virtual_cluster_id" in details
        assert not gcs_server.managers.jobs.jobs


class TestAutoscalerInputs:
    async def test_constraint_with_infinite_amount_is_rejected(self, stubs) -> None:
        constraint = A.ClusterResourceConstraint(
            resource_requests=[
                A.ResourceRequestByCount(
                    request=A.ResourceRequest(resources_bundle={"GPU": float("inf")}), count=1
                )
            ]
        )
        details = await rejected(
            stubs.autoscaler.RequestClusterResourceConstraint,
            A.RequestClusterResourceConstraintRequest(cluster_resource_constraint=constraint),
        )
        assert "resource_requests[0].request.resources_bundle[GPU]" in details

    async def test_report_with_nan_or_negative_version_is_rejected(self, gcs_server, stubs) -> None:
        state = A.AutoscalingState(
            autoscaler_state_version=1,
            infeasible_resource_requests=[A.ResourceRequest(resources_bundle={"CPU": -2})],
        )
        details = await rejected(
            stubs.autoscaler.ReportAutoscalingState,
            A.ReportAutoscalingStateRequest(autoscaling_state=state),
        )
        assert "autoscaling_state.infeasible_resource_requests[0].resources_bundle[CPU]" in details
        details = await rejected(
            stubs.autoscaler.ReportAutoscalingState,
            A.ReportAutoscalingStateRequest(
                autoscaling_state=A.AutoscalingState(autoscaler_state_version=-5)
            ),
        )
        assert "autoscaling_state.autoscaler_state_version" in details
        assert gcs_server.managers.autoscaler.autoscaling_state is None

    async def test_drain_reason_message_is_bounded(self, stubs) -> None:
        details = await rejected(
            stubs.autoscaler.DrainNode,
            A.DrainNodeRequest(node_id=b"\x04" * 28, reason=1, reason_message="r" * MB),
        )
        assert "reason_message" in details


class TestKv:
    async def test_value_over_the_limit_is_rejected(self, small_kv_server) -> None:
        """KV values are bounded by limits.max_kv_value_bytes (default: 512 MiB less a key)."""
        async with grpc.aio.insecure_channel(small_kv_server.address) as channel:
            assert small_kv_server.meta is not None
            stubs = Stubs(channel, small_kv_server.meta.cluster_id)
            put = stubs.kv.InternalKVPut
            await put(G.InternalKVPutRequest(namespace=b"n", key=b"k", value=b"v" * 1024))
            details = await rejected(
                put, G.InternalKVPutRequest(namespace=b"n", key=b"big", value=b"v" * 1025)
            )
            assert "value is 1025 bytes; the limit is 1024" in details
            details = await rejected(
                put, G.InternalKVPutRequest(namespace=b"n", key=b"k" * 65, value=b"v")
            )
            assert "key is 65 bytes" in details
            got = await stubs.kv.InternalKVMultiGet(
                G.InternalKVMultiGetRequest(namespace=b"n", keys=[b"k", b"big"])
            )
            assert [r.key for r in got.results] == [b"k"]

    async def test_rays_largest_runtime_env_package_is_stored(self, gcs_server) -> None:
        """Ray's ``test_runtime_env_working_dir_2.py::test_large_file_boundary`` uploads a
        package 1 MiB short of ``GCS_STORAGE_MAX_SIZE`` (512 MiB): 535,822,497 bytes, which
        our 500 MiB limit refused ("request is 535822497 bytes").

        The client runs on the server's event loop: the request is encoded before the call
        (a 511 MiB encoding, ~3 s at load, is the test's work, not the server's), so the
        deadline covers the transfer and the server's handling only
        (:data:`LARGEST_PUT_DEADLINE_S`)."""
        key = b"gcs://_ray_pkg_0123456789abcdef.zip"
        encoded = G.InternalKVPutRequest(
            namespace=b"", key=key, value=bytes(535_822_497)
        ).SerializeToString()
        async with grpc.aio.insecure_channel(gcs_server.address) as channel:
            assert gcs_server.meta is not None
            stubs = Stubs(channel, gcs_server.meta.cluster_id)
            put = channel.unary_unary(
                method_path(svc.INTERNAL_KV.methods_by_name["InternalKVPut"]),
                request_serializer=None,  # sent as encoded above
                response_deserializer=G.InternalKVPutReply.FromString,
            )
            metadata = (("ray_cluster_id", gcs_server.meta.cluster_id.hex()),)
            reply = await put(encoded, timeout=LARGEST_PUT_DEADLINE_S, metadata=metadata)
            assert reply.added
            del encoded
            exists = await stubs.kv.InternalKVExists(
                G.InternalKVExistsRequest(namespace=b"", key=key)
            )
            assert exists.exists

    async def test_megabyte_namespace_is_rejected(self, stubs) -> None:
        details = await rejected(
            stubs.kv.InternalKVPut,
            G.InternalKVPutRequest(namespace=b"n" * MB, key=b"k", value=b"v"),
        )
        assert "namespace" in details


class TestRequestSize:
    async def test_oversized_request_is_refused_before_decoding(self, gcs_server) -> None:
        """A request over limits.max_request_bytes is refused by size: 9 MiB of empty
        sub-messages would decode to ~250 MB."""
        raw = b"\x12\x00" * (9 * MB // 2)  # GetAllNodeInfoRequest.node_selectors, empty each
        async with grpc.aio.insecure_channel(gcs_server.address) as channel:
            call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetAllNodeInfo")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(raw, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "GetAllNodeInfoRequest is limited to" in (err.value.details() or "")

    async def test_rejected_requests_are_freed_without_a_gc_pass(self, gcs_server) -> None:
        """A rejected call leaves no reference cycle holding its request (it used to: each
        stayed until a full collection, which the server's GC tuning makes rare)."""
        request = G.RegisterNodeRequest(node_info=node(node_manager_address="a" * MB))
        raw = request.SerializeToString()
        gc.collect()
        gc.disable()
        try:
            async with grpc.aio.insecure_channel(gcs_server.address) as channel:
                call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/RegisterNode")
                for _ in range(20):
                    with pytest.raises(grpc.aio.AioRpcError):
                        await call(raw, timeout=10)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            held = [o for o in gc.garbage if type(o).__name__ == "RegisterNodeRequest"]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert not held


async def test_negative_autoscaling_replica_counts_are_rejected(gcs_server) -> None:
    """Replica counts and max_nodes of a VC's autoscaling config must be >= 0 (a negative
    minimum with max_nodes 0 used to be stored)."""
    async with grpc.aio.insecure_channel(gcs_server.address) as channel:
        vc = ServiceStub(channel, svc.VIRTUAL_CLUSTER_INFO, timeout_s=30)
        created = await vc.CreateOrUpdateVirtualCluster(
            V.CreateOrUpdateVirtualClusterRequest(virtual_cluster_id="vc1", divisible=True)
        )
        assert created.status.code == 0, created.status.message
        reply = await vc.UpdateAutoscalingConfig(
            V.UpdateAutoscalingConfigRequest(
                virtual_cluster_id="vc1",
                min_replica_sets={"t": -5},
                max_replica_sets={"t": -1},
                max_nodes=0,
            )
        )
        assert reply.status.code == INVALID_ARGUMENT
        assert "min_replica_sets[t] must be >= 0" in reply.status.message
        got = await vc.GetAutoscalingConfig(V.GetAutoscalingConfigRequest(virtual_cluster_id="vc1"))
        assert not got.min_replica_sets
