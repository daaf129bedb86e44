"""Copy-on-write membership: ``Members`` behaves like the dict it replaces, the undivided index
follows every move, and picks at scale stay lowest-alive-first without touching old versions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID as P
from gcs.policy.virtual_clusters import Kind
from gcs.policy.virtual_clusters.ids import UNDIVIDED
from gcs.policy.virtual_clusters.members import Members, build_index
from gcs.policy.virtual_clusters.model import Cluster
from tests.virtual_clusters.conftest import Harness, nid

IDS = [f"n{i:03}" for i in range(120)]
BUCKETS = (UNDIVIDED, "v##j1", "v##j2")


def template_of(node_id: str) -> str:
    return str(int(node_id[1:]) % 3)


moves = st.lists(
    st.tuples(
        st.dictionaries(st.sampled_from(IDS), st.sampled_from(BUCKETS), max_size=8),
        st.lists(st.sampled_from(IDS), max_size=8),
    ),
    max_size=60,
)


class TestMembers:
    @settings(max_examples=80, deadline=None)
    @given(start=st.dictionaries(st.sampled_from(IDS), st.sampled_from(BUCKETS)), steps=moves)
    def test_every_version_reads_like_a_dict_built_the_same_way(
        self, start: dict[str, str], steps: list[tuple[dict[str, str], list[str]]]
    ) -> None:
        """remove-then-add on a dict and on Members agree at every step (overlay and folded),
        and earlier versions keep their content."""
        expected = dict(start)
        members = Members.of(start)
        history: list[tuple[Members, dict[str, str]]] = []
        for add, remove in steps:
            for node_id in remove:
                expected.pop(node_id, None)
            expected.update(add)
            members = members.moved(add, remove)
            history.append((members, dict(expected)))
            assert members == expected and dict(members.items()) == expected
            assert len(members) == len(expected) and sorted(members) == sorted(expected)
            for node_id in IDS[:10]:
                assert (node_id in members) == (node_id in expected)
                assert members.get(node_id) == expected.get(node_id)
        for version, content in history:
            assert dict(version) == content

    def test_many_small_moves_fold_the_overlay_into_a_new_base(self) -> None:
        """The overlay stays bounded (a move costs O(sqrt(size)), not O(size))."""
        members = Members.of(dict.fromkeys(IDS, UNDIVIDED))
        for i in range(500):
            members = members.moved({IDS[i % 120]: BUCKETS[i % 3]}, [])
            assert len(members._changes) <= 64 + 2 * 11

    @settings(max_examples=80, deadline=None)
    @given(start=st.dictionaries(st.sampled_from(IDS), st.sampled_from(BUCKETS)), steps=moves)
    def test_the_undivided_index_follows_each_move_given_templates(
        self, start: dict[str, str], steps: list[tuple[dict[str, str], list[str]]]
    ) -> None:
        """A cluster moved with a template lookup carries an index equal to a rebuilt one."""
        cluster = Cluster(id="v", kind=Kind.DIVISIBLE, revision=1, members=start)
        cluster.undivided_index(template_of)
        for add, remove in steps:
            cluster = cluster.moved(add=add, remove=remove, template=template_of)
            assert cluster._undivided == build_index(cluster.members, template_of)

    def test_a_move_without_templates_drops_the_index_rather_than_keep_a_stale_one(
        self,
    ) -> None:
        """Without a lookup the next pick rebuilds the index from the members."""
        cluster = Cluster(id="v", kind=Kind.DIVISIBLE, revision=1, members={"n001": UNDIVIDED})
        cluster.undivided_index(template_of)
        moved = cluster.moved(add={"n002": UNDIVIDED})
        assert moved._undivided is None
        assert moved.undivided_index(template_of) == {"1": {"n001"}, "2": {"n002"}}


class TestPicksAtScale:
    @pytest.mark.parametrize("dead", [0, 2, 20, 150])
    def test_growing_takes_the_lowest_alive_ids_however_many_lowest_are_dead(
        self, dead: int
    ) -> None:
        """Dead nodes among the lowest candidates are skipped (every search depth)."""
        h = Harness(400, 2)
        for i in range(0, 2 * dead, 2):  # template "0" = even ids: the lowest `dead` die
            h.kill(nid(i))
        h.create("v", {"0": 3}, divisible=False)
        first = 2 * dead
        assert sorted(h.registry.get("v").members) == [nid(first), nid(first + 2), nid(first + 4)]

    def test_resizing_repeatedly_matches_a_plain_lowest_ids_model(self) -> None:
        """Hundreds of grow/shrink plans (overlays folded along the way) pick exactly what a
        sorted-list model picks: grow takes the lowest free ids, shrink gives back the lowest."""
        h = Harness(300, 3)
        free = {t: sorted(nid(i) for i in range(300) if i % 3 == int(t)) for t in "01"}
        held: dict[str, list[str]] = {"0": [], "1": []}
        h.create("a", {}, divisible=False)
        for step in range(200):
            wanted = {"0": 2 + step % 2, "1": step % 3}
            h.update("a", wanted)
            for t, count in wanted.items():
                while len(held[t]) > count:
                    free[t].append(held[t].pop(0))
                while len(held[t]) < count:
                    held[t].append(free[t].pop(0))
                free[t].sort()
                held[t].sort()
            assert sorted(h.registry.get("a").members) == sorted(held["0"] + held["1"])
        assert h.registry.invariant_violations() == []

    def test_a_discarded_plan_leaves_the_primary_and_its_index_untouched(self) -> None:
        """Planning shares the committed base; dropping the plan changes nothing."""
        h = Harness(50, 1)
        h.create("a", {"0": 2}, divisible=False)
        primary = h.registry.primary
        before = (dict(primary.members), dict(primary.undivided_index(lambda n: "0")))
        h.registry.create_or_update("b", False, {"0": 5})
        assert h.registry.primary is primary
        assert (dict(primary.members), dict(primary._undivided or {})) == before
        assert h.registry.get(P) is primary
