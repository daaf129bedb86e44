"""The raylet agent's virtual-cluster view: channel 11 snapshots, stale drops, refetch."""

from __future__ import annotations

from gcs.proto import virtual_cluster_data_pb2
from gcs.raylet.agent import RayletAgent, RayletConfig
from gcs.raylet.vc_view import VirtualClusterView
from gcs.server import GcsServer
from tests.conftest import fast_config

TableData = virtual_cluster_data_pb2.VirtualClusterTableData


class TestView:
    def test_stale_revisions_are_dropped(self) -> None:
        """A snapshot not newer than the held one is ignored; newer ones replace it."""
        view = VirtualClusterView()
        assert view.apply(TableData(id="vc", revision=5))
        assert not view.apply(TableData(id="vc", revision=5))
        assert not view.apply(TableData(id="vc", revision=3, is_removed=True))
        assert "vc" in view.clusters and view.dropped_stale == 2
        assert view.apply(TableData(id="vc", revision=5, is_removed=True))  # same revision
        assert "vc" not in view.clusters
        assert not view.apply(TableData(id="vc", revision=5, is_removed=True))
        assert not view.apply(TableData(id="vc", revision=4))  # no resurrection


class TestAgentSubscription:
    async def test_view_follows_the_gcs_and_refetches_after_restart(self, memory_store) -> None:
        """The agent sees an indivisible cluster created, updated and removed, and after the
        GCS restarts it refetches the view from the new GCS."""
        server = GcsServer(fast_config(), store=memory_store)
        await server.start()
        port = server.port
        agents = [
            RayletAgent(
                RayletConfig(
                    gcs_address=server.address,
                    node_type="4c8g",
                    resources={"CPU": 4.0},
                    rpc_timeout_s=2.0,
                )
            )
            for _ in range(3)
        ]
        try:
            for agent in agents:
                await agent.start()
            watcher = agents[0]
            vcs = server.managers.virtual_clusters
            created = await vcs.create_or_update("vc1", False, {"4c8g": 2}, 0)
            view = watcher.virtual_clusters
            await view.changes.until(lambda: "vc1" in view.clusters)
            held = watcher.virtual_clusters.clusters["vc1"]
            assert held.revision == created.revision and len(held.node_instances) == 2
            updated = await vcs.create_or_update("vc1", False, {"4c8g": 3}, created.revision)
            await view.changes.until(lambda: view.clusters["vc1"].revision == updated.revision)
            assert len(watcher.virtual_clusters.clusters["vc1"].node_instances) == 3
            assert watcher.virtual_clusters.cluster_of(watcher.node_id.hex()) == "vc1"

            await server.stop()
            server = GcsServer(fast_config(port=port), store=memory_store)
            await server.start()
            # the subscriber's next poll meets the new publisher: it resubscribes and
            # refetches the snapshot (replace_all), which has vc1 from the store
            refetched = view.changes.count
            await view.changes.until(lambda: view.changes.count > refetched)
            assert "vc1" in view.clusters
            await server.managers.virtual_clusters.remove("vc1")
            await view.changes.until(lambda: "vc1" not in view.clusters)
        finally:
            for agent in agents:
                await agent.stop()
            await server.stop()
