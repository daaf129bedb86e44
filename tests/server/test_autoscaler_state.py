"""AutoscalerStateService: snapshot content, versions, constraints, reports, drain, resize."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gcs.base.protowire import varint
from gcs.proto import autoscaler_pb2 as A
from gcs.proto import common_pb2, gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc.errors import ray_message
from tests.conftest import poll_rounds

S = A.NodeStatus


async def register(stubs, raylet, **overrides) -> None:
    await stubs.node_info.RegisterNode(
        G.RegisterNodeRequest(node_info=raylet.node_info(**overrides))
    )


async def state(stubs, last_seen: int = 0) -> A.ClusterResourceState:
    reply = await stubs.autoscaler.GetClusterResourceState(
        A.GetClusterResourceStateRequest(last_seen_cluster_resource_state_version=last_seen)
    )
    return reply.cluster_resource_state


def demand(shape, *, ready=0, infeasible=0, backlog=0, selector=None) -> gcs_pb2.ResourceDemand:
    d = gcs_pb2.ResourceDemand(
        shape=shape,
        num_ready_requests_queued=ready,
        num_infeasible_requests_queued=infeasible,
        backlog_size=backlog,
    )
    sel = d.label_selectors.add()
    if selector:
        sel.CopyFrom(selector)
    return d


class TestNodeStates:
    async def test_statuses_from_the_polled_load(
        self, stubs, raylets, gcs_server, gcs_clock
    ) -> None:
        """RUNNING, IDLE (with growing idle time), DRAINING and DEAD come out as Ray's."""
        busy, idle, draining, gone = [await raylets() for _ in range(4)]
        idle.load = gcs_pb2.ResourcesData(idle_duration_ms=5000)
        draining.load = gcs_pb2.ResourcesData(is_draining=True, idle_duration_ms=10)
        for r in (busy, idle, draining, gone):
            await register(stubs, r)
        await stubs.node_info.UnregisterNode(G.UnregisterNodeRequest(node_id=gone.node_id))
        await poll_rounds(gcs_server, gcs_clock)
        s = await state(stubs)
        by_id = {n.node_id: n for n in s.node_states}
        assert by_id[busy.node_id].status == S.RUNNING
        assert by_id[idle.node_id].status == S.IDLE
        assert by_id[idle.node_id].idle_duration_ms >= 5000
        assert by_id[draining.node_id].status == S.DRAINING
        dead = by_id[gone.node_id]
        assert dead.status == S.DEAD and not dead.total_resources and not dead.labels
        assert [n.status for n in s.node_states][-1] == S.DEAD  # alive first, then dead
        assert {n.node_state_version for n in s.node_states} == {s.cluster_resource_state_version}
        assert by_id[busy.node_id].labels["ray.io/node-id"] == busy.node_id.hex()
        assert by_id[busy.node_id].instance_id == busy.node_info().instance_id

    async def test_version_increments_per_read_and_rejects_the_future(self, stubs) -> None:
        """Each read bumps the version; a last-seen version above it is INVALID_ARGUMENT."""
        v1 = (await state(stubs)).cluster_resource_state_version
        v2 = (await state(stubs, last_seen=v1)).cluster_resource_state_version
        assert v2 == v1 + 1
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await state(stubs, last_seen=v2 + 100)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "last_seen_cluster_resource_state_version" in info.value.details()


class TestPendingDemand:
    async def test_demand_aggregated_by_shape_and_selector(
        self, stubs, raylets, gcs_server, gcs_clock
    ) -> None:
        """ready + infeasible + backlog summed across nodes per (shape, selector)."""
        a, b = await raylets(), await raylets()
        zone = common_pb2.LabelSelector(
            label_constraints=[
                common_pb2.LabelSelectorConstraint(
                    label_key="zone", operator=common_pb2.LABEL_OPERATOR_IN, label_values=["c", "d"]
                )
            ]
        )
        a.load = gcs_pb2.ResourcesData()
        a.load.resource_load_by_shape.resource_demands.extend(
            [demand({"CPU": 1}, backlog=2), demand({"GPU": 1}, infeasible=1)]
        )
        b.load = gcs_pb2.ResourcesData()
        b.load.resource_load_by_shape.resource_demands.extend(
            [demand({"CPU": 1}, ready=1), demand({"CPU": 1}, backlog=4, selector=zone)]
        )
        for r in (a, b):
            await register(stubs, r)
        await poll_rounds(gcs_server, gcs_clock)
        got = {}
        for by_count in (await state(stubs)).pending_resource_requests:
            key = (
                tuple(sorted(by_count.request.resources_bundle.items())),
                tuple(
                    c.label_key
                    for s in by_count.request.label_selectors
                    for c in s.label_constraints
                ),
            )
            got[key] = by_count.count
            assert len(by_count.request.label_selectors) == 1  # Ray keeps the empty selector
        assert got == {
            ((("CPU", 1.0),), ()): 3,
            ((("GPU", 1.0),), ()): 1,
            ((("CPU", 1.0),), ("zone",)): 4,
        }

    async def test_demand_disappears_when_work_is_scheduled(
        self, stubs, raylets, gcs_server, gcs_clock
    ) -> None:
        """A node whose queue drains stops contributing; a dead node's demand is dropped."""
        a = await raylets()
        a.load = gcs_pb2.ResourcesData()
        a.load.resource_load_by_shape.resource_demands.append(demand({"CPU": 2}, backlog=5))
        await register(stubs, a)
        await poll_rounds(gcs_server, gcs_clock)
        assert (await state(stubs)).pending_resource_requests[0].count == 5
        a.load = None
        await poll_rounds(gcs_server, gcs_clock)
        assert not (await state(stubs)).pending_resource_requests


class TestGangs:
    async def test_pending_placement_group_becomes_a_gang(self, stubs) -> None:
        """A pending STRICT_SPREAD PG is reported with Ray's details and anti-affinity."""
        pg_id = b"\x07" * 18
        spec = common_pb2.PlacementGroupSpec(
            placement_group_id=pg_id,
            strategy=common_pb2.STRICT_SPREAD,
            bundles=[
                common_pb2.Bundle(unit_resources={"CPU": 1}),
                common_pb2.Bundle(unit_resources={"GPU": 1}, label_selector={"zone": "b"}),
            ],
        )
        await stubs.pgs.CreatePlacementGroup(
            G.CreatePlacementGroupRequest(placement_group_spec=spec)
        )
        gangs = (await state(stubs)).pending_gang_resource_requests
        assert len(gangs) == 1
        gang = gangs[0]
        assert gang.details == f"{pg_id.hex()}:STRICT_SPREAD|PENDING"
        assert len(gang.requests) == 2
        assert gang.requests[0].placement_constraints[0].anti_affinity.label_name == (
            f"_PG_{pg_id.hex()}"
        )
        selected = gang.bundle_selectors[0].resource_requests[1]
        assert selected.label_selectors[0].label_constraints[0].label_values == ["b"]
        await stubs.pgs.RemovePlacementGroup(
            G.RemovePlacementGroupRequest(placement_group_id=pg_id)
        )
        assert not (await state(stubs)).pending_gang_resource_requests


class TestConstraintsAndReports:
    async def test_constraint_replaces_the_previous_one(self, stubs) -> None:
        """RequestClusterResourceConstraint replaces; an empty one still shows as one entry."""

        def constraint(shape, count):
            return A.ClusterResourceConstraint(
                resource_requests=[
                    A.ResourceRequestByCount(
                        request=A.ResourceRequest(resources_bundle=shape), count=count
                    )
                ]
            )

        await stubs.autoscaler.RequestClusterResourceConstraint(
            A.RequestClusterResourceConstraintRequest(
                cluster_resource_constraint=constraint({"CPU": 1}, 3)
            )
        )
        await stubs.autoscaler.RequestClusterResourceConstraint(
            A.RequestClusterResourceConstraintRequest(
                cluster_resource_constraint=constraint({"GPU": 1}, 2)
            )
        )
        s = await state(stubs)
        assert len(s.cluster_resource_constraints) == 1
        only = s.cluster_resource_constraints[0].resource_requests[0]
        assert dict(only.request.resources_bundle) == {"GPU": 1} and only.count == 2
        await stubs.autoscaler.RequestClusterResourceConstraint(
            A.RequestClusterResourceConstraintRequest()
        )
        s = await state(stubs)
        assert len(s.cluster_resource_constraints) == 1
        assert not s.cluster_resource_constraints[0].resource_requests

    @pytest.mark.parametrize(
        ("shape", "count", "needle"),
        [
            ({"CPU": -1}, 1, "resources_bundle[CPU]"),
            ({"CPU": float("nan")}, 1, "resources_bundle[CPU]"),
            ({"": 1}, 1, "empty name"),
            ({"CPU": 1}, -2, "count"),
        ],
    )
    async def test_bad_constraint_is_rejected_and_not_stored(
        self, stubs, shape, count, needle
    ) -> None:
        """Negative / NaN amounts, empty names, negative counts: INVALID_ARGUMENT, no write."""
        bad = A.ClusterResourceConstraint(
            resource_requests=[
                A.ResourceRequestByCount(
                    request=A.ResourceRequest(resources_bundle=shape), count=count
                )
            ]
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stubs.autoscaler.RequestClusterResourceConstraint(
                A.RequestClusterResourceConstraintRequest(cluster_resource_constraint=bad)
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in info.value.details()
        assert not (await state(stubs)).cluster_resource_constraints

    async def test_older_autoscaling_state_is_ignored(self, stubs) -> None:
        """GetClusterStatus returns the newest report; an older version does not replace it."""
        status = await stubs.autoscaler.GetClusterStatus(A.GetClusterStatusRequest())
        assert not status.HasField("autoscaling_state")
        for version, node_type in ((5, "new"), (3, "old")):
            await stubs.autoscaler.ReportAutoscalingState(
                A.ReportAutoscalingStateRequest(
                    autoscaling_state=A.AutoscalingState(
                        autoscaler_state_version=version,
                        pending_instance_requests=[
                            A.PendingInstanceRequest(ray_node_type_name=node_type, count=1)
                        ],
                    )
                )
            )
        status = await stubs.autoscaler.GetClusterStatus(A.GetClusterStatusRequest())
        assert status.autoscaling_state.autoscaler_state_version == 5
        assert status.autoscaling_state.pending_instance_requests[0].ray_node_type_name == "new"

    async def test_cluster_status_frames_the_state_bytes_unparsed(self, stubs, gcs_server) -> None:
        """GetClusterStatus is the state's bytes as built, framed (no parse back into a
        message to serialize again) and after them the reported autoscaling state's."""
        manager = gcs_server.managers.autoscaler
        reported = A.AutoscalingState(autoscaler_state_version=7)
        await stubs.autoscaler.ReportAutoscalingState(
            A.ReportAutoscalingStateRequest(autoscaling_state=reported)
        )
        wire = await manager.cluster_status()
        assert isinstance(wire, bytes)
        version = manager.version.current
        expected = manager._build(version)  # what cluster_resource_state_bytes built
        assert wire.endswith(b"\x12" + varint(len(expected)) + expected)
        reply = A.GetClusterStatusReply.FromString(wire)
        assert reply.autoscaling_state == reported
        assert reply.cluster_resource_state.cluster_resource_state_version == version

    async def test_cluster_config_lands_in_kv(self, stubs) -> None:
        """ReportClusterConfig is stored at __autoscaler/__autoscaler_cluster_config."""
        config = A.ClusterConfig(max_resources={"CPU": 100})
        await stubs.autoscaler.ReportClusterConfig(
            A.ReportClusterConfigRequest(cluster_config=config)
        )
        got = await stubs.kv.InternalKVGet(
            G.InternalKVGetRequest(namespace=b"__autoscaler", key=b"__autoscaler_cluster_config")
        )
        assert A.ClusterConfig.FromString(got.value) == config


class TestDrainAndResize:
    async def test_drain_is_forwarded_and_rejection_returned(self, stubs, raylets) -> None:
        """The raylet's answer (incl. its rejection reason) comes back to the caller."""
        r = await raylets()
        await register(stubs, r)
        r.drain_accept = False
        reply = await stubs.autoscaler.DrainNode(
            A.DrainNodeRequest(
                node_id=r.node_id,
                reason=A.DRAIN_NODE_REASON_IDLE_TERMINATION,
                reason_message="idle",
                deadline_timestamp_ms=0,
            )
        )
        assert not reply.is_accepted and reply.rejection_reason_message == "busy: 1 lease running"
        assert r.drains[0].reason == A.DRAIN_NODE_REASON_IDLE_TERMINATION
        r.drain_accept = True
        reply = await stubs.autoscaler.DrainNode(
            A.DrainNodeRequest(node_id=r.node_id, reason=A.DRAIN_NODE_REASON_PREEMPTION)
        )
        assert reply.is_accepted

    async def test_idle_drain_answered_by_the_drained_node_leaving(self, stubs, raylets) -> None:
        """A raylet that accepts an idle drain unregisters (AUTOSCALER_DRAIN_IDLE) and exits;
        its DrainRaylet reply can be lost with it.  The node's drained death answers the
        DrainNode call at once (it used to wait out the raylet deadline and fail, so the
        autoscaler retried a node that was already gone and logged no drain)."""
        r = await raylets()
        await register(stubs, r)
        r.drain_reply_lost = True
        call = asyncio.ensure_future(
            stubs.autoscaler.DrainNode(
                A.DrainNodeRequest(
                    node_id=r.node_id,
                    reason=A.DRAIN_NODE_REASON_IDLE_TERMINATION,
                    reason_message="idle",
                )
            )
        )
        await r.changes.until(lambda: len(r.drains) == 1)
        assert not call.done()
        await stubs.node_info.UnregisterNode(
            G.UnregisterNodeRequest(
                node_id=r.node_id,
                node_death_info=common_pb2.NodeDeathInfo(
                    reason=common_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_IDLE, reason_message="idle"
                ),
            )
        )
        reply = await asyncio.wait_for(call, timeout=10)
        assert reply.is_accepted

    async def test_drain_of_unknown_node_is_accepted(self, stubs) -> None:
        """Ray accepts draining a node that is not alive (nothing to do)."""
        reply = await stubs.autoscaler.DrainNode(A.DrainNodeRequest(node_id=b"\x05" * 28))
        assert reply.is_accepted

    @pytest.mark.parametrize(
        ("request_kwargs", "code", "needle"),
        [
            ({"node_id": b"abc"}, grpc.StatusCode.INVALID_ARGUMENT, "node_id"),
            ({"node_id": b""}, grpc.StatusCode.INVALID_ARGUMENT, "node_id"),
            ({"node_id": b"\x05" * 28, "reason": 9}, grpc.StatusCode.INVALID_ARGUMENT, "reason"),
            (  # Ray 2.60's words, in the error details (ray_message)
                {"node_id": b"\x05" * 28, "deadline_timestamp_ms": -1},
                grpc.StatusCode.ABORTED,
                "Invalid: Draining deadline must be non-negative, received -1",
            ),
        ],
    )
    async def test_bad_drain_requests(self, stubs, request_kwargs, code, needle) -> None:
        """Malformed ids, unknown reasons, negative deadlines fail cleanly (never a crash)."""
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stubs.autoscaler.DrainNode(A.DrainNodeRequest(**request_kwargs))
        assert info.value.code() == code and needle in ray_message(info.value)

    async def test_resize_is_forwarded_and_totals_returned(self, stubs, raylets) -> None:
        """Resize reaches the raylet; its new totals are replied and the view updated."""
        r = await raylets({"CPU": 1})
        await register(stubs, r)
        reply = await stubs.autoscaler.ResizeRayletResourceInstances(
            A.ResizeRayletResourceInstancesRequest(node_id=r.node_id, resources={"CPU": 3})
        )
        assert reply.total_resources["CPU"] == 3
        # the view moves at once, availability with the total (the autoscaler's next round)
        state = (
            await stubs.autoscaler.GetClusterResourceState(A.GetClusterResourceStateRequest())
        ).cluster_resource_state
        (ns,) = [n for n in state.node_states if n.node_id == r.node_id]
        assert ns.total_resources["CPU"] == 3 and ns.available_resources["CPU"] == 3
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stubs.autoscaler.ResizeRayletResourceInstances(
                A.ResizeRayletResourceInstancesRequest(node_id=r.node_id, resources={"GPU": 1})
            )
        assert info.value.code() == grpc.StatusCode.ABORTED
        assert info.value.details() == "InvalidArgument"

    async def test_resize_of_dead_node_is_not_found(self, stubs) -> None:
        """Ray's NotFound: 'Raylet <hex> is not alive.'"""
        node_id = b"\x06" * 28
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stubs.autoscaler.ResizeRayletResourceInstances(
                A.ResizeRayletResourceInstancesRequest(node_id=node_id, resources={"CPU": 1})
            )
        # Ray's form: details the code name, the message as the binary error details
        assert info.value.code() == grpc.StatusCode.ABORTED
        assert info.value.details() == "NotFound"
        assert ray_message(info.value) == f"NotFound: Raylet {node_id.hex()} is not alive."
