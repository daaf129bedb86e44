"""What the SDK puts on the wire, observed by a recording in-process GCS."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import grpc
import pytest

from gcs.proto import autoscaler_pb2, common_pb2
from gcs.rpc.descriptors import AUTOSCALER_STATE
from gcs.sdk import (
    AsyncGcsClient,
    ClusterStatusSummary,
    ResourceDemand,
    RpcError,
    get_cluster_status,
    get_cluster_status_async,
    request_resources,
    request_resources_async,
)
from gcs.testing.recording_gcs import RecordingGcs

IN = common_pb2.LABEL_OPERATOR_IN
NOT_IN = common_pb2.LABEL_OPERATOR_NOT_IN


@pytest.fixture
async def gcs() -> AsyncIterator[RecordingGcs]:
    async with RecordingGcs() as server:
        yield server


def _constraint(gcs: RecordingGcs) -> autoscaler_pb2.RequestClusterResourceConstraintRequest:
    (call,) = gcs.calls_to("RequestClusterResourceConstraint")
    return call.request


class TestHandshake:
    async def test_cluster_id_is_fetched_without_metadata_then_sent_as_hex(
        self, gcs: RecordingGcs
    ) -> None:
        """GetClusterId goes first with no ray_cluster_id; later calls carry its hex."""
        await asyncio.to_thread(request_resources, num_cpus=1, address=gcs.address)
        first, second = gcs.calls
        assert first.method == "GetClusterId"
        assert first.metadata_value("ray_cluster_id") is None
        assert second.method == "RequestClusterResourceConstraint"
        assert second.metadata_value("ray_cluster_id") == gcs.cluster_id.hex()

    async def test_async_client_reuses_one_handshake_for_many_calls(
        self, gcs: RecordingGcs
    ) -> None:
        """One connect, then every call carries the id; no second GetClusterId."""
        async with AsyncGcsClient(gcs.address) as client:
            assert client.cluster_id == gcs.cluster_id
            for _ in range(2):
                await client.call(
                    AUTOSCALER_STATE, "GetClusterStatus", autoscaler_pb2.GetClusterStatusRequest()
                )
        assert [c.method for c in gcs.calls] == [
            "GetClusterId",
            "GetClusterStatus",
            "GetClusterStatus",
        ]
        assert all(
            c.metadata_value("ray_cluster_id") == gcs.cluster_id.hex() for c in gcs.calls[1:]
        )


class TestRequestResourcesMessage:
    async def test_identical_bundles_are_counted(self, gcs: RecordingGcs) -> None:
        """num_cpus=2 plus one {CPU:1} bundle is a single group with count 3."""
        await request_resources_async(num_cpus=2, bundles=[{"CPU": 1}], address=gcs.address)
        (group,) = _constraint(gcs).cluster_resource_constraint.resource_requests
        assert dict(group.request.resources_bundle) == {"CPU": 1.0}
        assert group.count == 3
        assert not group.request.label_selectors

    async def test_groups_keep_first_seen_order(self, gcs: RecordingGcs) -> None:
        """Groups appear in the order their first bundle was given."""
        await request_resources_async(
            bundles=[{"GPU": 1}, {"CPU": 2}, {"GPU": 1}], address=gcs.address
        )
        groups = _constraint(gcs).cluster_resource_constraint.resource_requests
        assert [(dict(g.request.resources_bundle), g.count) for g in groups] == [
            ({"GPU": 1.0}, 2),
            ({"CPU": 2.0}, 1),
        ]

    async def test_selectors_are_parsed_per_bundle(self, gcs: RecordingGcs) -> None:
        """'in(a,b)' is IN [a, b], '!v' is NOT_IN [v]; an empty selector adds no entry."""
        await request_resources_async(
            bundles=[{"GPU": 1, "CPU": 4}, {"CPU": 1}],
            bundle_label_selectors=[{"accelerator-type": "in(A100,H100)", "market": "!spot"}, {}],
            address=gcs.address,
        )
        with_selector, without = _constraint(gcs).cluster_resource_constraint.resource_requests
        (selector,) = with_selector.request.label_selectors
        assert [
            (c.label_key, c.operator, list(c.label_values)) for c in selector.label_constraints
        ] == [("accelerator-type", IN, ["A100", "H100"]), ("market", NOT_IN, ["spot"])]
        assert not without.request.label_selectors

    async def test_same_bundle_with_different_selectors_are_separate_groups(
        self, gcs: RecordingGcs
    ) -> None:
        """Grouping is by (bundle, selector), not by bundle alone."""
        await request_resources_async(
            bundles=[{"CPU": 1}, {"CPU": 1}, {"CPU": 1}],
            bundle_label_selectors=[{"z": "a"}, {}, {"z": "a"}],
            address=gcs.address,
        )
        groups = _constraint(gcs).cluster_resource_constraint.resource_requests
        assert [(len(g.request.label_selectors), g.count) for g in groups] == [(1, 2), (0, 1)]

    async def test_in_values_are_split_untrimmed_and_deduplicated_like_rays(
        self, gcs: RecordingGcs
    ) -> None:
        """Ray's client sends 'in(a, b,a)' as ['a', ' b'] and '(x,y)' as a literal value."""
        await request_resources_async(
            bundles=[{"CPU": 1}],
            bundle_label_selectors=[{"k": "!in(a, b,a)", "lit": "(x,y)", "e": ""}],
            address=gcs.address,
        )
        (group,) = _constraint(gcs).cluster_resource_constraint.resource_requests
        (selector,) = group.request.label_selectors
        assert [
            (c.label_key, c.operator, list(c.label_values)) for c in selector.label_constraints
        ] == [("k", NOT_IN, ["a", " b"]), ("lit", IN, ["(x,y)"]), ("e", IN, [""])]

    async def test_empty_bundle_still_sends_an_empty_request(self, gcs: RecordingGcs) -> None:
        """Ray's client always sets ``request``, so ``{}`` arrives as ``request {}``."""
        await request_resources_async(bundles=[{}], address=gcs.address)
        (group,) = _constraint(gcs).cluster_resource_constraint.resource_requests
        assert group.HasField("request")
        assert group.count == 1

    async def test_nothing_requested_sends_an_empty_message(self, gcs: RecordingGcs) -> None:
        """No arguments clears the constraint with an empty request, as Ray sends it."""
        await request_resources_async(address=gcs.address)
        (call,) = gcs.calls_to("RequestClusterResourceConstraint")
        assert call.raw == b""

    async def test_address_comes_from_gcs_address_env(
        self, gcs: RecordingGcs, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without address= the SDK dials GCS_ADDRESS."""
        monkeypatch.setenv("GCS_ADDRESS", gcs.address)
        monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
        await request_resources_async(num_cpus=1)
        assert len(gcs.calls_to("RequestClusterResourceConstraint")) == 1


class TestClusterStatus:
    async def test_returns_the_servers_reply(self, gcs: RecordingGcs) -> None:
        """get_cluster_status gives back the GetClusterStatusReply as sent."""
        reply = autoscaler_pb2.GetClusterStatusReply()
        reply.cluster_resource_state.cluster_resource_state_version = 7
        reply.autoscaling_state.autoscaler_state_version = 3
        gcs.set_status_reply(reply)
        assert await asyncio.to_thread(get_cluster_status, gcs.address) == reply
        assert await get_cluster_status_async(gcs.address) == reply


class TestErrors:
    async def test_rpc_errors_carry_the_grpc_status(self, gcs: RecordingGcs) -> None:
        """A server abort surfaces as RpcError with .status and .details."""
        gcs.fail("RequestClusterResourceConstraint", grpc.StatusCode.ABORTED, "InvalidArgument")
        with pytest.raises(RpcError) as info:
            await request_resources_async(num_cpus=1, address=gcs.address)
        assert info.value.status is grpc.StatusCode.ABORTED
        assert info.value.details == "InvalidArgument"
        assert info.value.method == (
            "/ray.rpc.autoscaler.AutoscalerStateService/RequestClusterResourceConstraint"
        )

    async def test_sync_calls_raise_the_same_error(self, gcs: RecordingGcs) -> None:
        """The blocking client translates errors identically."""
        gcs.fail("GetClusterStatus", grpc.StatusCode.PERMISSION_DENIED, "no")
        with pytest.raises(RpcError) as info:
            await asyncio.to_thread(get_cluster_status, gcs.address)
        assert info.value.status is grpc.StatusCode.PERMISSION_DENIED

    async def test_unreachable_gcs_is_unavailable(self) -> None:
        """Nothing listening: the handshake fails with UNAVAILABLE, not a hang."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with pytest.raises(RpcError) as info:
            await request_resources_async(num_cpus=1, address=f"127.0.0.1:{port}", timeout_s=5)
        assert info.value.status is grpc.StatusCode.UNAVAILABLE
        assert info.value.method == "/ray.rpc.NodeInfoGcsService/GetClusterId"


class TestStatusSummary:
    def test_summary_counts_nodes_and_sums_live_resources(self) -> None:
        """Dead nodes are counted by status but their resources are not summed."""
        reply = autoscaler_pb2.GetClusterStatusReply()
        state = reply.cluster_resource_state
        state.cluster_session_name = "s"
        for status, cpus in ((autoscaler_pb2.RUNNING, 4), (autoscaler_pb2.IDLE, 2)):
            node = state.node_states.add(status=status)
            node.total_resources["CPU"] = cpus
            node.available_resources["CPU"] = cpus / 2
        state.node_states.add(status=autoscaler_pb2.DEAD).total_resources["CPU"] = 100
        group = state.cluster_resource_constraints.add().resource_requests.add(count=3)
        group.request.resources_bundle["GPU"] = 1
        group.request.label_selectors.add().label_constraints.add(
            label_key="zone", operator=NOT_IN, label_values=["a", "b"]
        )
        reply.autoscaling_state.pending_instances.add()
        summary = ClusterStatusSummary.from_reply(reply)
        assert summary.nodes_by_status == {"RUNNING": 1, "IDLE": 1, "DEAD": 1}
        assert summary.total_resources == {"CPU": 6.0}
        assert summary.available_resources == {"CPU": 3.0}
        assert summary.constraints == (ResourceDemand({"GPU": 1.0}, 3, ("zone !in (a,b)",)),)
        assert summary.pending_instances == 1
        assert summary.failed_instance_requests == 0
