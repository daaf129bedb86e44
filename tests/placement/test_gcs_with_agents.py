"""A real GCS and real raylet agents over gRPC: a pending group is gang demand in
GetClusterResourceState; placed, it is not, the bundles are in the raylets' reports and
their nodes carry the ``_PG_<hex>`` label; RemovePlacementGroup gives the resources back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from gcs.policy.placement.naming import indexed_name
from gcs.proto import autoscaler_pb2 as A
from gcs.proto import common_pb2, gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.raylet.agent import RayletAgent, RayletConfig
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import Stubs, fast_config

PG_ID = bytes(range(1, 19))
PG = gcs_pb2.PlacementGroupTableData


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[GcsServer, Stubs, list[RayletAgent]]]:
    server = GcsServer(fast_config(), store=MemoryStore())
    await server.start()
    assert server.meta is not None
    agents: list[RayletAgent] = []
    async with grpc.aio.insecure_channel(server.address) as channel:
        try:
            yield server, Stubs(channel, server.meta.cluster_id), agents
        finally:
            for agent in agents:
                await agent.stop()
            await server.stop()


async def add_agent(server: GcsServer, agents: list[RayletAgent]) -> RayletAgent:
    agent = RayletAgent(
        RayletConfig(gcs_address=server.address, resources={"CPU": 2.0}, node_type="cpu2")
    )
    await agent.start()
    agents.append(agent)
    return agent


async def gangs(stubs: Stubs) -> list[A.GangResourceRequest]:
    reply = await stubs.autoscaler.GetClusterResourceState(A.GetClusterResourceStateRequest())
    return list(reply.cluster_resource_state.pending_gang_resource_requests)


async def test_pending_gang_until_placed_then_resources_move(cluster) -> None:  # type: ignore[no-untyped-def]
    server, stubs, agents = cluster
    for _ in range(2):
        await add_agent(server, agents)
    spec = common_pb2.PlacementGroupSpec(
        placement_group_id=PG_ID,
        strategy=common_pb2.STRICT_SPREAD,
        bundles=[common_pb2.Bundle(unit_resources={"CPU": 1}) for _ in range(3)],
    )
    await stubs.pgs.CreatePlacementGroup(G.CreatePlacementGroupRequest(placement_group_spec=spec))
    [gang] = await gangs(stubs)
    assert len(gang.requests) == 3 and gang.details.endswith("STRICT_SPREAD|PENDING")
    with pytest.raises(grpc.aio.AioRpcError) as err:  # not placeable on 2 nodes
        await stubs.pgs.WaitPlacementGroupUntilReady(
            G.WaitPlacementGroupUntilReadyRequest(placement_group_id=PG_ID), timeout=0.5
        )
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    third = await add_agent(server, agents)
    reply = await stubs.pgs.WaitPlacementGroupUntilReady(
        G.WaitPlacementGroupUntilReadyRequest(placement_group_id=PG_ID), timeout=30
    )
    assert reply.status.code == 0
    assert await gangs(stubs) == []
    got = await stubs.pgs.GetPlacementGroup(G.GetPlacementGroupRequest(placement_group_id=PG_ID))
    table = got.placement_group_table_data
    assert table.state == PG.CREATED
    assert {b.node_id for b in table.bundles} == {a.node_id for a in agents}
    on_third = next(b.bundle_id.bundle_index for b in table.bundles if b.node_id == third.node_id)
    data = third.servicer.resources_data()  # type: ignore[attr-defined]
    assert data.resources_total[indexed_name("CPU", PG_ID, on_third)] == 1
    assert data.resources_available["CPU"] == 1

    async def labelled() -> bool:
        reply = await stubs.autoscaler.GetClusterResourceState(A.GetClusterResourceStateRequest())
        return all(
            f"_PG_{PG_ID.hex()}" in n.dynamic_labels
            for n in reply.cluster_resource_state.node_states
        )

    assert await labelled()  # CREATED: the labels are in the very next snapshot
    await stubs.pgs.RemovePlacementGroup(G.RemovePlacementGroupRequest(placement_group_id=PG_ID))
    for agent in agents:  # each raylet is told to return its bundle
        await agent.resources.changes.until(lambda a=agent: a.resources.total == {"CPU": 2.0})
    assert all(
        dict(a.servicer.resources_data().resources_total) == {"CPU": 2.0}  # type: ignore[attr-defined]
        for a in agents
    )


async def test_restart_keeps_created_groups_and_releases_stale_bundles() -> None:
    """GCS restart on the same store: the group stays CREATED on the same nodes, and each
    raylet is told what is in use (ReleaseUnusedBundles): a bundle the GCS does not know
    (prepared for a group it never recorded) is released, the committed ones stay."""
    store = MemoryStore()
    server = GcsServer(fast_config(), store=store)
    await server.start()
    agents: list[RayletAgent] = []
    restarted: GcsServer | None = None
    try:
        for _ in range(2):
            await add_agent(server, agents)
        assert server.meta is not None
        async with grpc.aio.insecure_channel(server.address) as channel:
            stubs = Stubs(channel, server.meta.cluster_id)
            spec = common_pb2.PlacementGroupSpec(
                placement_group_id=PG_ID,
                strategy=common_pb2.STRICT_SPREAD,
                bundles=[common_pb2.Bundle(unit_resources={"CPU": 1}) for _ in range(2)],
                is_detached=True,
            )
            await stubs.pgs.CreatePlacementGroup(
                G.CreatePlacementGroupRequest(placement_group_spec=spec)
            )
            await stubs.pgs.WaitPlacementGroupUntilReady(
                G.WaitPlacementGroupUntilReadyRequest(placement_group_id=PG_ID), timeout=30
            )
        stale = (b"\x09" * 18, 0)
        assert agents[0].resources.prepare_bundles([(stale, {"CPU": 1})])
        port = server.port
        await server.stop()
        restarted = GcsServer(fast_config(port=port), store=store)
        await restarted.start()
        assert restarted.managers is not None
        pg = restarted.managers.placement_groups.groups[PG_ID]
        assert pg.state == PG.CREATED

        await agents[0].resources.changes.until(
            lambda: stale not in agents[0].resources.bundles()  # ReleaseUnusedBundles
        )
        for agent in agents:
            held = agent.resources.bundles()
            assert list(held.values()) == [True] and next(iter(held))[0] == PG_ID
            assert agent.resources.available["CPU"] == 1.0
    finally:
        for agent in agents:
            await agent.stop()
        if restarted is not None:
            await restarted.stop()
        await server.stop()
