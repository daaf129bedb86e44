"""VirtualClusterInfoGcsService over gRPC against a running GCS (memory and Redis stores)."""

from __future__ import annotations

import asyncio
from collections import Counter

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID
from gcs.proto import virtual_cluster_pb2

V = virtual_cluster_pb2


def templates(reply) -> dict[str, int]:
    return dict(Counter(n.template_id for n in reply.node_instances.values()))


class TestCreateUpdateRemove:
    async def test_create_update_and_remove_move_nodes_and_persist(self, vc_env) -> None:
        """A divisible cluster takes the requested nodes, updates with its revision, is
        stored under its id, and removal returns its nodes to the primary."""
        created = await vc_env.create("vc1", {"4c8g": 2, "8c16g": 1}, divisible=True)
        assert created.status.code == 0
        assert created.revision > 0
        assert templates(created) == {"4c8g": 2, "8c16g": 1}
        assert set(created.node_instances) <= set(vc_env.small + vc_env.large)
        assert "vc1" in await vc_env.stored_ids()

        updated = await vc_env.create("vc1", {"4c8g": 1}, divisible=True, revision=created.revision)
        assert updated.status.code == 0
        assert updated.revision > created.revision
        assert templates(updated) == {"4c8g": 1}
        assert set((await vc_env.clusters("vc1"))["vc1"].node_instances) == set(
            updated.node_instances
        )

        removed = await vc_env.vc.RemoveVirtualCluster(
            V.RemoveVirtualClusterRequest(virtual_cluster_id="vc1")
        )
        assert removed.status.code == 0
        assert await vc_env.clusters() == {}
        assert "vc1" not in await vc_env.stored_ids()
        assert vc_env.manager.registry.invariant_violations() == []

    async def test_short_of_nodes_fails_with_recommendation(self, vc_env) -> None:
        """Asking for more nodes than the primary has is OutOfResource with what is possible."""
        reply = await vc_env.create("vc1", {"4c8g": 5, "8c16g": 1})
        assert reply.status.code == 31
        assert reply.status.message.startswith("No enough nodes to add to the virtual cluster")
        assert dict(reply.replica_sets_to_recommend) == {"4c8g": 3, "8c16g": 1}
        assert await vc_env.clusters() == {}

    async def test_invalid_requests_answer_in_the_reply_status(self, vc_env) -> None:
        """Validation failures are gRPC OK with ant-ray's code 34 and exact message."""
        empty = await vc_env.create("", {})
        assert (empty.status.code, empty.status.message) == (
            34,
            "Invalid request, the virtual cluster id is empty.",
        )
        primary = await vc_env.create(PRIMARY_CLUSTER_ID, {})
        assert primary.status.message == (
            "Invalid request, kPrimaryClusterID can not be created or updated."
        )


class TestRevisions:
    async def test_stale_revision_fails_and_changes_nothing(self, vc_env) -> None:
        """A wrong revision is rejected; the cluster, its stored row and the primary stay."""
        created = await vc_env.create("vc1", {"4c8g": 1})
        before_row = await vc_env.store.get("VIRTUAL_CLUSTER", b"vc1")
        before_primary = vc_env.manager.registry.primary
        stale = await vc_env.create("vc1", {"4c8g": 2}, revision=created.revision - 1)
        assert stale.status.code == 34
        assert stale.status.message == (
            f"The revision ({created.revision - 1}) is expired, the latest revision of the "
            f"virtual cluster vc1 is {created.revision}"
        )
        assert await vc_env.store.get("VIRTUAL_CLUSTER", b"vc1") == before_row
        assert vc_env.manager.registry.primary == before_primary
        assert (await vc_env.clusters("vc1"))["vc1"].revision == created.revision

    async def test_concurrent_updates_with_one_revision_let_exactly_one_win(self, vc_env) -> None:
        """Two updates racing with the same revision: one succeeds, the other is expired."""
        created = await vc_env.create("vc1", {"4c8g": 1})
        replies = await asyncio.gather(
            vc_env.create("vc1", {"4c8g": 2}, revision=created.revision),
            vc_env.create("vc1", {"8c16g": 1}, revision=created.revision),
        )
        codes = sorted(r.status.code for r in replies)
        assert codes == [0, 34]
        winner = next(r for r in replies if r.status.code == 0)
        assert (await vc_env.clusters("vc1"))["vc1"].revision == winner.revision
        assert vc_env.manager.registry.invariant_violations() == []


class TestOtherRpcs:
    async def test_job_cluster_remove_nodes_views_and_autoscaling_config(self, vc_env) -> None:
        """CreateJobCluster, RemoveNodes, GetAllVirtualClusterInfo and the autoscaling config
        work end to end."""
        await vc_env.create("div", {"4c8g": 2}, divisible=True)
        job = await vc_env.vc.CreateJobCluster(
            V.CreateJobClusterRequest(
                virtual_cluster_id="div", job_id="raysubmit_1", replica_sets={"4c8g": 1}
            )
        )
        assert job.status.code == 0 and job.job_cluster_id == "div##raysubmit_1"
        short = await vc_env.vc.CreateJobCluster(
            V.CreateJobClusterRequest(
                virtual_cluster_id="div", job_id="raysubmit_2", replica_sets={"4c8g": 2}
            )
        )
        assert short.status.code == 31
        assert dict(short.replica_sets_to_recommend) == {}

        ind = await vc_env.create("ind", {"8c16g": 1})
        node = next(iter(ind.node_instances))
        removed = await vc_env.vc.RemoveNodesFromVirtualCluster(
            V.RemoveNodesFromVirtualClusterRequest(virtual_cluster_id="ind", nodes_to_remove=[node])
        )
        assert removed.status.code == 0
        again = await vc_env.vc.RemoveNodesFromVirtualCluster(
            V.RemoveNodesFromVirtualClusterRequest(virtual_cluster_id="ind", nodes_to_remove=[node])
        )
        assert again.status.code == 37 and list(again.nodes_with_failure) == [node]

        views = await vc_env.vc.GetAllVirtualClusterInfo(V.GetAllVirtualClusterInfoRequest())
        ids = [v.id for v in views.virtual_clusters_view]
        assert ids[-1] == PRIMARY_CLUSTER_ID and "div##raysubmit_1" in ids
        div_view = next(v for v in views.virtual_clusters_view if v.id == "div")
        assert all(v.resources_total["CPU"] == 4 for v in div_view.node_instance_views.values())

        config = await vc_env.vc.UpdateAutoscalingConfig(
            V.UpdateAutoscalingConfigRequest(
                virtual_cluster_id="ind",
                min_replica_sets={"8c16g": 1},
                max_replica_sets={"8c16g": 2},
                max_nodes=3,
            )
        )
        assert config.status.code == 0
        got = await vc_env.vc.GetAutoscalingConfig(
            V.GetAutoscalingConfigRequest(virtual_cluster_id="ind")
        )
        assert (dict(got.min_replica_sets), dict(got.max_replica_sets), got.max_nodes) == (
            {"8c16g": 1},
            {"8c16g": 2},
            3,
        )
        missing = await vc_env.vc.GetAutoscalingConfig(
            V.GetAutoscalingConfigRequest(virtual_cluster_id="nope")
        )
        assert missing.status.message == "Invalid request, the virtual cluster id does not exist."
