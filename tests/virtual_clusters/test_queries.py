"""Read-side helpers other GCS parts use (reference §8, §11) and node-table conversion."""

from __future__ import annotations

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID as P
from gcs.policy.virtual_clusters.convert import node_view_from_gcs_node_info
from gcs.proto import gcs_pb2
from tests.virtual_clusters.conftest import Harness


class TestNodeFilters:
    def test_node_filter_by_cluster(self) -> None:
        """J6: '' or None = no filter; unknown = no node; dead members still match."""
        h = Harness(6, 2)
        h.create("v", {"0": 2}, divisible=False)
        members = frozenset(h.registry.get("v").members)
        h.kill(sorted(members)[0])
        assert h.registry.nodes_in("v") == members
        assert h.registry.nodes_in("") is None and h.registry.nodes_in(None) is None
        assert h.registry.nodes_in("FAKE") == frozenset()

    def test_scheduling_predicate(self) -> None:
        """§8: empty, primary or unknown ids allow any node; otherwise membership."""
        h = Harness(4, 1)
        h.create("v", {"0": 1}, divisible=False)
        (inside,) = h.registry.get("v").members
        outside = sorted(h.registry.primary.members)[0]
        assert h.registry.is_node_schedulable("v", inside)
        assert not h.registry.is_node_schedulable("v", outside)
        for cluster_id in ("", P, "unknown"):
            assert h.registry.is_node_schedulable(cluster_id, outside)


class TestAutoscalerStates:
    def test_states_cover_every_cluster_with_the_right_nodes(self) -> None:
        """§11: job clusters name their parent; divisible clusters list undivided nodes only."""
        h = Harness(8, 1)
        h.create("d", {"0": 3})
        h.create("i", {"0": 2}, divisible=False)
        jc = h.job("d", "j", {"0": 1})
        h.run(h.registry.update_autoscaling_config("i", {"0": 1}, {"0": 4}, 5))
        states = h.registry.autoscaler_states()
        assert sorted(states) == sorted([P, "d", "i", jc])
        assert states[jc].parent_virtual_cluster_id == "d"
        assert states["d"].parent_virtual_cluster_id == ""
        assert len(states["d"].nodes) == 2 and len(states[jc].nodes) == 1
        assert len(states[P].nodes) == 3 and states[P].divisible
        assert (states["i"].max_nodes, dict(states["i"].max_replica_sets)) == (5, {"0": 4})


class TestNodeTableConversion:
    def test_template_is_node_type_name_and_id_is_hex(self) -> None:
        """The template id is ``node_type_name``; the key is the hex node id."""
        info = gcs_pb2.GcsNodeInfo(
            node_id=bytes(range(28)),
            node_type_name="4c8g",
            node_manager_hostname="host-1",
            state=gcs_pb2.GcsNodeInfo.DEAD,
        )
        view = node_view_from_gcs_node_info(info)
        assert (view.node_id, view.template_id, view.hostname, view.is_dead) == (
            bytes(range(28)).hex(),
            "4c8g",
            "host-1",
            True,
        )
