"""Node events, replenishment, VC scope filters, per-VC autoscaler state, channel 11."""

from __future__ import annotations

import grpc

from gcs.base.clock import FakeClock
from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID
from gcs.proto import autoscaler_pb2, gcs_pb2, gcs_service_pb2, pubsub_pb2, virtual_cluster_pb2
from gcs.proto.virtual_cluster_data_pb2 import VirtualClusterTableData
from gcs.sdk._subscriber import GcsSubscriber
from gcs.store.memory import MemoryStore
from tests.conftest import Seen
from tests.virtual_clusters.service_env import VcEnv, quiet_config

Req = gcs_service_pb2


class TestReplenish:
    async def test_dead_node_of_an_indivisible_cluster_is_replaced_on_the_periodic_pass(
        self,
    ) -> None:
        """A node of an indivisible cluster dies; the next replenish pass swaps in a spare of
        the same type, persists it, and the dead node goes back to the primary."""
        clock = FakeClock()
        env = await VcEnv(
            MemoryStore(), quiet_config(node_instances_replenish_interval_ms=100), clock=clock
        ).start()
        try:
            await env.add_nodes("4c8g", 2)
            created = await env.create("ind", {"4c8g": 1})
            (victim,) = created.node_instances
            await env.kill(victim)
            registry = env.manager.registry
            assert registry.node(victim).is_dead

            def replaced() -> bool:
                members = registry.get("ind").members
                return victim not in members and len(members) == 1

            await clock.advance_until(replaced, step_s=0.1)  # the next periodic pass
            rows = await env.store.get_all("VIRTUAL_CLUSTER")
            data = VirtualClusterTableData.FromString(rows[b"ind"])
            assert victim not in data.node_instances and len(data.node_instances) == 1
            assert victim in registry.primary.members
            assert registry.invariant_violations() == []
        finally:
            await env.close()


class TestScopeFilters:
    async def test_node_and_resource_queries_are_restricted_to_the_cluster(
        self, memory_env
    ) -> None:
        """GetAllNodeInfo(filters.virtual_cluster_id), GetAllAvailableResources and
        GetAllTotalResources list only the cluster's nodes; an unknown cluster lists none."""
        created = await memory_env.create("ind", {"8c16g": 2})
        members = {bytes.fromhex(n) for n in created.node_instances}
        request = Req.GetAllNodeInfoRequest()
        request.filters.virtual_cluster_id = "ind"
        nodes = await memory_env.stubs.node_info.GetAllNodeInfo(request)
        assert {n.node_id for n in nodes.node_info_list} == members
        request.filters.virtual_cluster_id = "FAKE"
        assert not (await memory_env.stubs.node_info.GetAllNodeInfo(request)).node_info_list
        everyone = await memory_env.stubs.node_info.GetAllNodeInfo(Req.GetAllNodeInfoRequest())
        assert len(everyone.node_info_list) == 5

        stub = memory_env.stubs.node_resources
        avail = await stub.GetAllAvailableResources(
            Req.GetAllAvailableResourcesRequest(virtual_cluster_id="ind")
        )
        assert {r.node_id for r in avail.resources_list} == members
        total = await stub.GetAllTotalResources(
            Req.GetAllTotalResourcesRequest(virtual_cluster_id="ind")
        )
        assert sum(r.resources_total["CPU"] for r in total.resources_list) == 16
        unknown = await stub.GetAllTotalResources(
            Req.GetAllTotalResourcesRequest(virtual_cluster_id="FAKE")
        )
        assert not unknown.resources_list
        assert (
            len((await stub.GetAllTotalResources(Req.GetAllTotalResourcesRequest())).resources_list)
            == 5
        )


class TestAutoscalerState:
    async def test_cluster_resource_state_carries_per_cluster_states_and_demand(
        self, memory_env
    ) -> None:
        """virtual_cluster_states has the primary and each cluster; an indivisible cluster
        carries the pending shapes its jobs queued (rows naming a job of the cluster); the
        cached section follows changes."""
        stub = memory_env.stubs.autoscaler
        request = autoscaler_pb2.GetClusterResourceStateRequest()
        before = await stub.GetClusterResourceState(request)
        assert not before.cluster_resource_state.virtual_cluster_states

        created = await memory_env.create("ind", {"4c8g": 1})
        await memory_env.create("div", {"8c16g": 1}, divisible=True)
        (node,) = created.node_instances
        await memory_env.add_job(b"\x07\x00\x00\x00", "ind")
        raylet = memory_env.raylet(node)
        raylet.load = gcs_pb2.ResourcesData()
        raylet.load.resource_load_by_shape.resource_demands.add(
            shape={"CPU": 2}, num_ready_requests_queued=1, backlog_size=2, job_id=b"\x07\0\0\0"
        )
        raylet.load.resource_load_by_shape.resource_demands.add(
            shape={"CPU": 1},
            num_ready_requests_queued=5,  # no job: not the cluster's
        )

        async def has_demand() -> bool:
            state = (await stub.GetClusterResourceState(request)).cluster_resource_state
            ind = state.virtual_cluster_states.get("ind")
            return ind is not None and bool(ind.pending_resource_requests)

        clock = memory_env.fake_clock
        await clock.advance_until(has_demand, step_s=0.1)  # the next load poll
        state = (await stub.GetClusterResourceState(request)).cluster_resource_state
        states = state.virtual_cluster_states
        assert set(states) == {"ind", "div", PRIMARY_CLUSTER_ID}
        ind = states["ind"]
        assert (ind.divisible, list(ind.nodes)) == (False, [node])
        assert ind.revision == created.revision
        (pending,) = ind.pending_resource_requests
        assert (dict(pending.request.resources_bundle), pending.count) == ({"CPU": 2}, 3)
        assert not states["div"].pending_resource_requests
        assert states[PRIMARY_CLUSTER_ID].divisible
        assert node not in states[PRIMARY_CLUSTER_ID].nodes
        assert len(states[PRIMARY_CLUSTER_ID].nodes) == 3


class TestPublish:
    async def test_subscriber_sees_full_snapshots_of_indivisible_clusters_only(
        self, memory_env
    ) -> None:
        """A real subscriber on channel 11 gets indivisible creates and removals (with
        is_removed) as full snapshots keyed by id, and nothing for divisible clusters."""
        got = Seen()
        async with grpc.aio.insecure_channel(memory_env.server.address) as channel:
            sub = GcsSubscriber(channel, on_message=got.append)
            await sub.start()
            await sub.subscribe(pubsub_pb2.RAY_VIRTUAL_CLUSTER_CHANNEL)
            await memory_env.create("div", {"8c16g": 1}, divisible=True)
            created = await memory_env.create("ind", {"4c8g": 2})
            await memory_env.vc.RemoveVirtualCluster(
                virtual_cluster_pb2.RemoveVirtualClusterRequest(virtual_cluster_id="ind")
            )
            # a sentinel published last: the channel is ordered, so once it arrives anything
            # else published before it (e.g. for the divisible cluster) would have too
            await memory_env.create("sentinel", {"4c8g": 1})
            await got.until(lambda: any(m.key_id == b"sentinel" for m in got))
            await sub.close()
        assert [m.key_id for m in got] == [b"ind", b"ind", b"sentinel"]
        first, second = (m.virtual_cluster_message for m in got[:2])
        assert (first.id, first.is_removed, first.revision) == ("ind", False, created.revision)
        assert set(first.node_instances) == set(created.node_instances)
        assert second.is_removed and set(second.node_instances) == set(created.node_instances)
