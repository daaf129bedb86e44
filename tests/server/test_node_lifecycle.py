"""NodeInfoGcsService: register, list with filters, liveness, death by health check."""

from __future__ import annotations

import grpc
import pytest

from gcs.proto import common_pb2, gcs_pb2, pubsub_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import NODE_INFO
from tests.conftest import Seen

ALIVE, DEAD = gcs_pb2.GcsNodeInfo.ALIVE, gcs_pb2.GcsNodeInfo.DEAD


class TestClusterId:
    async def test_cluster_id_is_28_bytes_and_stable(self, gcs_server, stubs) -> None:
        """GetClusterId answers without metadata and returns the persisted id."""
        async with grpc.aio.insecure_channel(gcs_server.address) as ch:
            reply = await ServiceStub(ch, NODE_INFO).GetClusterId(G.GetClusterIdRequest())
        assert len(reply.cluster_id) == 28
        assert reply.cluster_id == stubs.cluster_id

    async def test_wrong_cluster_id_is_unauthenticated(self, gcs_server) -> None:
        """A client carrying another cluster's id gets Ray's WrongClusterID error."""
        async with grpc.aio.insecure_channel(gcs_server.address) as ch:
            stub = ServiceStub(ch, NODE_INFO, metadata=[("ray_cluster_id", "ab" * 28)])
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetAllNodeInfo(G.GetAllNodeInfoRequest())
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert info.value.details().startswith("WrongClusterID")


class TestRegister:
    async def test_registered_node_is_listed_alive(self, stubs, raylets) -> None:
        """A registered node shows up ALIVE with its type and labels."""
        r = await raylets({"CPU": 8}, "cpu8")
        await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=r.node_info()))
        reply = await stubs.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest())
        assert reply.total == 1 and reply.num_filtered == 0
        node = reply.node_info_list[0]
        assert node.state == ALIVE and node.node_type_name == "cpu8"
        assert node.resources_total["CPU"] == 8

    async def test_registration_is_idempotent(self, stubs, raylets) -> None:
        """Registering the same node twice (a raylet retry) keeps one entry."""
        r = await raylets()
        for _ in range(2):
            await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=r.node_info()))
        reply = await stubs.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest())
        assert reply.total == 1

    async def test_registration_publishes_node_info_and_liveness(self, memory_store) -> None:
        """Both the full node info and the address/liveness record are published."""
        from gcs.base.clock import FakeClock
        from gcs.managers.nodes import NodeManager

        published: list[tuple[int, bytes]] = []
        nodes = NodeManager(
            memory_store, FakeClock(), publish=lambda ch, key, msg: published.append((ch, key))
        )
        node_id = b"\x07" * 28
        await nodes.register(
            gcs_pb2.GcsNodeInfo(node_id=node_id, node_manager_address="x", node_manager_port=1)
        )
        assert (pubsub_pb2.GCS_NODE_INFO_CHANNEL, node_id) in published
        assert (pubsub_pb2.GCS_NODE_ADDRESS_AND_LIVENESS_CHANNEL, node_id) in published

    async def test_new_head_fails_the_old_head(self, stubs, raylets) -> None:
        """Only one head is alive: a new head's registration marks the previous one dead."""
        old, new = await raylets(), await raylets()
        await stubs.node_info.RegisterNode(
            G.RegisterNodeRequest(node_info=old.node_info(is_head_node=True))
        )
        await stubs.node_info.RegisterNode(
            G.RegisterNodeRequest(node_info=new.node_info(is_head_node=True))
        )
        reply = await stubs.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest())
        states = {n.node_id: n.state for n in reply.node_info_list}
        assert states == {old.node_id: DEAD, new.node_id: ALIVE}


class TestQueries:
    async def _three(self, stubs, raylets):
        nodes = [await raylets() for _ in range(3)]
        for i, r in enumerate(nodes):
            info = r.node_info(node_name=f"n{i}", is_head_node=(i == 0))
            await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=info))
        await stubs.node_info.UnregisterNode(
            G.UnregisterNodeRequest(
                node_id=nodes[2].node_id, node_death_info=common_pb2.NodeDeathInfo(reason=1)
            )
        )
        return nodes

    async def test_filters_limit_and_counts(self, stubs, raylets) -> None:
        """state_filter, selectors (OR-ed) and limit narrow the list; total counts all."""
        nodes = await self._three(stubs, raylets)
        alive = await stubs.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest(state_filter=ALIVE))
        assert {n.node_id for n in alive.node_info_list} == {nodes[0].node_id, nodes[1].node_id}
        assert alive.total == 3 and alive.num_filtered == 1
        head = await stubs.node_info.GetAllNodeInfo(
            G.GetAllNodeInfoRequest(
                node_selectors=[G.GetAllNodeInfoRequest.NodeSelector(is_head_node=True)]
            )
        )
        assert [n.node_id for n in head.node_info_list] == [nodes[0].node_id]
        by_name = await stubs.node_info.GetAllNodeInfo(
            G.GetAllNodeInfoRequest(
                node_selectors=[
                    G.GetAllNodeInfoRequest.NodeSelector(node_name="n1"),
                    G.GetAllNodeInfoRequest.NodeSelector(node_id=nodes[2].node_id),
                ]
            )
        )
        assert {n.node_id for n in by_name.node_info_list} == {nodes[1].node_id, nodes[2].node_id}
        limited = await stubs.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest(limit=1))
        assert len(limited.node_info_list) == 1 and limited.num_filtered == 2

    async def test_unknown_node_id_selector_matches_nothing(self, stubs, raylets) -> None:
        """A node-id selector miss returns nothing and counts everything as filtered."""
        await self._three(stubs, raylets)
        reply = await stubs.node_info.GetAllNodeInfo(
            G.GetAllNodeInfoRequest(
                node_selectors=[G.GetAllNodeInfoRequest.NodeSelector(node_id=b"\x01" * 28)]
            )
        )
        assert not reply.node_info_list and reply.total == 3 and reply.num_filtered == 3

    async def test_address_and_liveness_and_check_alive(self, stubs, raylets) -> None:
        """Liveness lists address + state; CheckAlive answers per id with Ray's version."""
        nodes = await self._three(stubs, raylets)
        reply = await stubs.node_info.GetAllNodeAddressAndLiveness(
            G.GetAllNodeAddressAndLivenessRequest()
        )
        states = {n.node_id: n.state for n in reply.node_info_list}
        assert states[nodes[2].node_id] == DEAD and states[nodes[0].node_id] == ALIVE
        dead = next(n for n in reply.node_info_list if n.state == DEAD)
        assert dead.death_info.reason == common_pb2.NodeDeathInfo.EXPECTED_TERMINATION
        alive = await stubs.node_info.CheckAlive(
            G.CheckAliveRequest(node_ids=[nodes[0].node_id, nodes[2].node_id, b"\x02" * 28])
        )
        assert list(alive.raylet_alive) == [True, False, False]
        assert alive.ray_version == "2.60.0" and alive.is_leader


class TestDeath:
    async def test_unreachable_raylet_is_marked_dead_and_kept(self, memory_store, raylets) -> None:
        """A raylet that stops answering health checks becomes DEAD with Ray's death info,
        on the fake clock: no check is due until the test moves time, and the node dies on
        exactly the ``failure_threshold``-th failed check, however slow the machine."""
        from gcs.base.clock import FakeClock
        from gcs.server import GcsServer
        from tests.conftest import Stubs, fast_config

        clock = FakeClock()
        config = fast_config()
        tick_s = 0.2  # the checker's loop: it starts the checks due at each tick
        server = GcsServer(config, store=memory_store, clock=clock)
        await server.start()
        try:
            assert server.managers is not None and server.meta is not None
            checker, checker_nodes = server.managers.health, server.managers.nodes
            async with grpc.aio.insecure_channel(server.address) as channel:
                stubs = Stubs(channel, server.meta.cluster_id)
                r = await raylets()
                await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=r.node_info()))
                await r.stop()

                async def state() -> int:
                    reply = await stubs.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest())
                    return reply.node_info_list[0].state

                assert checker.checks == 0  # nothing is due before the clock moves
                for failed in range(1, config.health.failure_threshold + 1):
                    await clock.advance_until(lambda n=failed: checker.failures == n, tick_s)
                    if failed < config.health.failure_threshold:
                        assert await state() == ALIVE
                await clock.advance_until(lambda: r.node_id not in checker_nodes.alive, tick_s)
                assert await state() == DEAD
                node = (
                    await stubs.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest())
                ).node_info_list[0]
        finally:
            await server.stop()
        assert node.death_info.reason == common_pb2.NodeDeathInfo.UNEXPECTED_TERMINATION
        assert node.death_info.reason_message == (
            "health check failed due to missing too many heartbeats"
        )
        assert node.end_time_ms > 0

    async def test_dead_node_cannot_reregister(self, stubs, raylets) -> None:
        """A node id that died stays dead: re-registration is refused with a reason."""
        r = await raylets()
        await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=r.node_info()))
        await stubs.node_info.UnregisterNode(G.UnregisterNodeRequest(node_id=r.node_id))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=r.node_info()))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "marked dead" in info.value.details()

    async def test_dead_cache_is_bounded_and_evicts_from_the_store(self, memory_store) -> None:
        """Beyond max_dead_nodes_cached, the oldest dead node leaves cache and table."""
        from gcs.base.clock import FakeClock
        from gcs.managers.nodes import NodeManager
        from gcs.store.base import TABLE_NODE

        nodes = NodeManager(memory_store, FakeClock(), max_dead_cached=2)
        ids = [bytes([i]) * 28 for i in range(1, 5)]
        for node_id in ids:
            await nodes.register(
                gcs_pb2.GcsNodeInfo(node_id=node_id, node_manager_address="x", node_manager_port=1)
            )
            await nodes.mark_dead(node_id, 2, "gone")
        assert list(nodes.dead) == ids[2:]
        assert set(await memory_store.get_all(TABLE_NODE)) == set(ids[2:])


class TestNodePubsub:
    async def test_subscriber_gets_full_record_then_death_delta(
        self, gcs_server, stubs, raylets
    ) -> None:
        """Over real long polls: registration publishes the whole GcsNodeInfo and the address;
        an unregister publishes the death delta on both channels."""
        from gcs.sdk._subscriber import GcsSubscriber

        got = Seen()
        async with grpc.aio.insecure_channel(gcs_server.address) as ch:
            sub = GcsSubscriber(ch, on_message=got.append)
            await sub.start()
            await sub.subscribe(pubsub_pb2.GCS_NODE_INFO_CHANNEL)
            await sub.subscribe(pubsub_pb2.GCS_NODE_ADDRESS_AND_LIVENESS_CHANNEL)
            r = await raylets({"CPU": 2}, "cpu2")
            await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=r.node_info()))
            await stubs.node_info.UnregisterNode(
                G.UnregisterNodeRequest(
                    node_id=r.node_id, node_death_info=common_pb2.NodeDeathInfo(reason=1)
                )
            )
            await got.until(lambda: len(got) == 4)
            await sub.close()
        info = [m.node_info_message for m in got if m.HasField("node_info_message")]
        live = [
            m.node_address_and_liveness_message
            for m in got
            if m.HasField("node_address_and_liveness_message")
        ]
        assert info[0].node_type_name == "cpu2" and info[0].state == ALIVE
        assert info[1].state == DEAD and not info[1].node_type_name  # delta only
        assert info[1].death_info.reason == common_pb2.NodeDeathInfo.EXPECTED_TERMINATION
        assert live[0].node_manager_port == r.port and live[1].state == DEAD
        assert all(m.key_id == r.node_id for m in got)
        assert [m.sequence_id for m in got] == sorted(m.sequence_id for m in got)
