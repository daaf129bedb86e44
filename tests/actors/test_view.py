"""The live cluster view the actor scheduler reads."""

from __future__ import annotations

from gcs.base.clock import FakeClock
from gcs.managers.actors.cluster_view import LiveClusterView
from gcs.managers.resources import ResourceCache
from gcs.proto import gcs_pb2
from tests.actors.harness import node_id, node_info

PG = gcs_pb2.PlacementGroupTableData


class TestLiveClusterView:
    def test_candidates_carry_resources_bundles_and_draining(self) -> None:
        cache = ResourceCache(FakeClock())
        alive = {node_id(n): node_info(n) for n in (1, 2)}
        for node in alive.values():
            cache.on_node_added(node)
        cache.apply(
            node_id(2),
            gcs_pb2.ResourcesData(
                node_id=node_id(2),
                resources_total={"CPU": 4},
                resources_available={"CPU": 1},
                draining_deadline_timestamp_ms=123,
            ),
        )
        pg = PG(placement_group_id=b"\7" * 18, state=PG.CREATED)
        pg.bundles.add(node_id=node_id(1))
        pg.bundles.add(node_id=node_id(2))
        removed = PG(placement_group_id=b"\x08" * 18, state=PG.REMOVED)
        removed.bundles.add(node_id=node_id(1))
        view = LiveClusterView(alive, cache, {pg.placement_group_id: pg, b"\x08" * 18: removed})
        by_id = {c.node_id: c for c in view.candidates()}
        assert by_id[node_id(1)].available == {"CPU": 4} and not by_id[node_id(1)].draining
        assert by_id[node_id(1)].bundles == {(b"\7" * 18, 0)}
        assert by_id[node_id(2)].available == {"CPU": 1} and by_id[node_id(2)].draining
        assert by_id[node_id(2)].bundles == {(b"\7" * 18, 1)}
        assert view.raylet_address(node_id(2)) == "127.0.0.2:40002"
        assert view.raylet_address(node_id(9)) is None

    def test_a_jobs_virtual_cluster_limits_its_nodes(self) -> None:
        members = frozenset({node_id(2)})
        view = LiveClusterView(
            {},
            ResourceCache(FakeClock()),
            {},
            job_cluster=lambda job: "vc1" if job == b"\1\0\0\0" else "",
            cluster_nodes=lambda cluster: members if cluster == "vc1" else None,
        )
        assert view.allowed_nodes(b"\1\0\0\0") == members
        assert view.allowed_nodes(b"\2\0\0\0") is None
