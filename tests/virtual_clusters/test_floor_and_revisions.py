"""The floor a virtual cluster keeps, and a new revision for every change of its nodes
(issue 18 items 7 and 8), on the pure registry.

Floor, per template: ``min_replica_sets`` where the autoscaling config names the template
(less than declared, or more), else the replica sets the tenant declared (its last
CreateOrUpdate).  Autoscaler moves keep the declared replica sets and never cross the floor;
an operator's RemoveNodes lowers them.  Revisions: create/update, release, move-in,
replenishment and node death each give the cluster a new one, stored and (indivisible)
published, so an update at the old revision fails.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID as P
from gcs.policy.virtual_clusters.errors import VcError, VcStatusCode
from gcs.policy.virtual_clusters.model import floor
from tests.virtual_clusters.conftest import Harness


@pytest.fixture
def h() -> Harness:
    return Harness(8, 2)  # templates "0" and "1", four nodes each


def nodes_of(h: Harness, cluster_id: str, template: str) -> list[str]:
    cluster = h.registry.get(cluster_id)
    assert cluster is not None
    return sorted(n for n in cluster.members if h.registry.node(n).template_id == template)


def expired(h: Harness, call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(VcError) as info:
        call()
    assert info.value.code == VcStatusCode.InvalidArgument
    assert "is expired" in info.value.message


class TestFloor:
    def test_declared_replica_sets_unless_min_names_the_template(self, h: Harness) -> None:
        cluster = h.create("v", {"0": 2, "1": 1}, divisible=False).cluster
        assert cluster.declared == {"0": 2, "1": 1}
        assert floor(cluster) == {"0": 2, "1": 1}
        allows_less = replace(cluster, min_replica_sets={"0": 0})
        assert floor(allows_less) == {"1": 1}
        asks_more = replace(cluster, min_replica_sets={"1": 3})
        assert floor(asks_more) == {"0": 2, "1": 3}

    def test_the_autoscaler_sees_the_floor_as_min_replica_sets(self, h: Harness) -> None:
        """What autoscalers (ours, ant-ray's) keep: VirtualClusterState.min_replica_sets;
        GetAutoscalingConfig still answers the configured min."""
        h.create("v", {"0": 2, "1": 1}, divisible=False)
        assert dict(h.registry.autoscaler_states()["v"].min_replica_sets) == {"0": 2, "1": 1}
        h.run(h.registry.update_autoscaling_config("v", {"0": 1}, {"0": 4}, 5))
        assert dict(h.registry.autoscaler_states()["v"].min_replica_sets) == {"0": 1, "1": 1}
        assert h.registry.get_autoscaling_config("v").min_replica_sets == {"0": 1}
        assert h.registry.get("v").declared == {"0": 2, "1": 1}  # the config keeps it

    def test_declared_is_stored_and_replayed(self, h: Harness) -> None:
        h.create("v", {"0": 2}, divisible=False)
        assert dict(h.registry.table_data("v").declared_replica_sets) == {"0": 2}
        h.restart()
        assert h.registry.get("v").declared == {"0": 2}

    def test_tenant_update_redeclares(self, h: Harness) -> None:
        h.create("v", {"0": 2}, divisible=False)
        h.update("v", {"0": 1, "1": 1})
        assert h.registry.get("v").declared == {"0": 1, "1": 1}


class TestAutoscalerRelease:
    def test_a_release_below_the_declared_floor_is_refused(self, h: Harness) -> None:
        """The issue's case: {"0": 1} declared, its only node idle; the release fails and
        nothing moves (the old code released it and left the cluster with {})."""
        h.create("v", {"0": 1}, divisible=False)
        (node,) = nodes_of(h, "v", "0")
        before = h.registry.get("v")
        with pytest.raises(VcError) as info:
            h.registry.remove_nodes("v", [node], autoscaler=True)
        assert info.value.code == VcStatusCode.UnsafeToRemove
        assert "below its floor (0: 1)" in info.value.message
        assert info.value.nodes_with_failure == [node]
        assert h.registry.get("v") is before

    def test_above_the_floor_a_release_keeps_the_declared_replica_sets(self, h: Harness) -> None:
        h.create("v", {"0": 1}, divisible=False)
        grown = h.run(
            h.registry.create_or_update(
                "v", False, {"0": 3}, h.registry.get("v").revision, autoscaler=True
            )
        )
        assert grown.cluster.declared == {"0": 1}  # a move-in is not a declaration
        spare = nodes_of(h, "v", "0")[:2]
        h.run(h.registry.remove_nodes("v", spare, autoscaler=True))
        assert h.counts("v") == {"0": 1} and h.registry.get("v").declared == {"0": 1}
        (last,) = nodes_of(h, "v", "0")
        with pytest.raises(VcError):
            h.registry.remove_nodes("v", [last], autoscaler=True)

    def test_dead_members_do_not_hold_the_floor(self, h: Harness) -> None:
        """Declared {"0": 1}, grown to 2, then one dies: the alive one is the reservation."""
        h.create("v", {"0": 1}, divisible=False)
        rev = h.registry.get("v").revision
        h.run(h.registry.create_or_update("v", False, {"0": 2}, rev, autoscaler=True))
        dead, alive = nodes_of(h, "v", "0")
        h.kill(dead)
        with pytest.raises(VcError) as info:
            h.registry.remove_nodes("v", [alive], autoscaler=True)
        assert info.value.nodes_with_failure == [alive]
        h.run(h.registry.remove_nodes("v", [dead], autoscaler=True))
        assert nodes_of(h, "v", "0") == [alive]

    def test_min_replica_sets_may_allow_less(self, h: Harness) -> None:
        h.create("v", {"0": 1}, divisible=False)
        h.run(h.registry.update_autoscaling_config("v", {"0": 0}, {"0": 2}, 2))
        (node,) = nodes_of(h, "v", "0")
        h.run(h.registry.remove_nodes("v", [node], autoscaler=True))
        assert h.counts("v") == {} and h.registry.get("v").declared == {"0": 1}

    def test_an_autoscaler_update_may_not_shrink_below_the_floor(self, h: Harness) -> None:
        h.create("v", {"0": 2}, divisible=False)
        rev = h.registry.get("v").revision
        with pytest.raises(VcError) as info:
            h.registry.create_or_update("v", False, {"0": 1}, rev, autoscaler=True)
        assert info.value.code == VcStatusCode.UnsafeToRemove

    def test_an_operator_removal_lowers_the_declared_replica_sets(self, h: Harness) -> None:
        """RemoveNodes without the autoscaler flag is the operator's: it is obeyed, and the
        floor follows it (or the autoscaler would move the node straight back)."""
        h.create("v", {"0": 2, "1": 1}, divisible=False)
        h.run(h.registry.remove_nodes("v", nodes_of(h, "v", "0")[:1]))
        assert h.registry.get("v").declared == {"0": 1, "1": 1}
        h.run(h.registry.remove_nodes("v", nodes_of(h, "v", "1")))
        assert h.registry.get("v").declared == {"0": 1}


class TestRevisions:
    def test_release_gives_a_new_revision_and_a_stale_update_fails(self, h: Harness) -> None:
        """Item 8: after the autoscaler releases a node, an update at the old revision is
        refused (the old code kept the revision and accepted it)."""
        h.create("v", {"0": 2}, divisible=False)
        h.run(h.registry.update_autoscaling_config("v", {"0": 0}, {"0": 2}, 2))
        old = h.registry.get("v").revision
        plan = h.run(h.registry.remove_nodes("v", nodes_of(h, "v", "0")[:1], autoscaler=True))
        new = h.registry.get("v").revision
        assert new > old
        assert plan.puts["v"].revision == new and [m.revision for m in plan.publishes] == [new]
        expired(h, lambda: h.registry.create_or_update("v", False, {"0": 0}, old))

    def test_a_release_at_a_stale_revision_moves_nothing(self, h: Harness) -> None:
        h.create("v", {"0": 2}, divisible=False)
        h.run(h.registry.update_autoscaling_config("v", {"0": 0}, {"0": 2}, 2))
        seen = h.registry.get("v").revision
        h.update("v", {"0": 2})  # the tenant, meanwhile
        node = nodes_of(h, "v", "0")[0]
        expired(h, lambda: h.registry.remove_nodes("v", [node], revision=seen, autoscaler=True))
        assert h.counts("v") == {"0": 2}

    def test_move_in_gives_a_new_revision(self, h: Harness) -> None:
        old = h.create("v", {"0": 1}, divisible=False).revision
        grown = h.run(h.registry.create_or_update("v", False, {"0": 2}, old, autoscaler=True))
        assert grown.revision > old
        expired(h, lambda: h.registry.create_or_update("v", False, {"0": 1}, old))

    def test_node_death_gives_every_holder_a_new_revision(self, h: Harness) -> None:
        """A node lent to a job cluster dies: the job cluster (published) and its divisible
        parent (stored only) get new revisions; the primary's own nodes change nothing."""
        h.create("d", {"0": 2})
        job = h.job("d", "j", {"0": 1})
        (node,) = h.registry.get(job).members
        before = {c: h.registry.get(c).revision for c in ("d", job)}
        h.kill(node)
        assert h.registry.held_outside_primary(node)
        plan = h.run(h.registry.note_node_death(node))
        for cluster_id, revision in before.items():
            assert h.registry.get(cluster_id).revision > revision
            assert plan.puts[cluster_id].revision == h.registry.get(cluster_id).revision
        assert [m.id for m in plan.publishes] == [job]
        free = sorted(h.registry.primary.undivided())[0]
        assert not h.registry.held_outside_primary(free)
        assert h.registry.note_node_death(free).empty

    def test_replenishment_gives_a_new_revision(self, h: Harness) -> None:
        old = h.create("v", {"0": 1}, divisible=False).revision
        (node,) = nodes_of(h, "v", "0")
        h.kill(node)
        h.run(h.registry.note_node_death(node))
        dead_rev = h.registry.get("v").revision
        assert dead_rev > old
        plan = h.run(h.registry.replenish())
        assert h.registry.get("v").revision > dead_rev
        assert [m.id for m in plan.publishes] == ["v"]
        expired(h, lambda: h.registry.create_or_update("v", False, {"0": 1}, dead_rev))

    def test_autoscaling_config_keeps_the_revision(self, h: Harness) -> None:
        """Not a change of nodes or replica sets (ant-ray R21)."""
        old = h.create("v", {"0": 1}, divisible=False).revision
        h.run(h.registry.update_autoscaling_config("v", {"0": 0}, {"0": 1}, 1))
        assert h.registry.get("v").revision == old

    def test_the_primary_is_not_revised_by_node_events(self, h: Harness) -> None:
        rev = h.registry.get(P).revision
        h.kill(sorted(h.registry.primary.undivided())[0])
        assert h.registry.get(P).revision == rev
