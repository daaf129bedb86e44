"""The pure bundle-placement policy: strategies, labels, infeasible vs no resources, VCs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gcs.policy.placement.policy import (
    PACK,
    SPREAD,
    STRICT_PACK,
    STRICT_SPREAD,
    BundleDemand,
    GroupRequest,
    NodeView,
    Outcome,
    matches,
    place_groups,
    selector_from_map,
)


def node(name: str, free: float = 4, total: float | None = None, **labels: str) -> NodeView:
    cap = {"CPU": total if total is not None else free}
    return NodeView(name.encode(), {"CPU": free}, cap, labels)


def group(strategy: int, *cpus: float, **kw: object) -> GroupRequest:
    bundles = tuple(BundleDemand(i, {"CPU": c}) for i, c in enumerate(cpus))
    return GroupRequest(b"pg", strategy, bundles, **kw)  # type: ignore[arg-type]


def nodes_of(result: object) -> list[bytes]:
    return [result.assignment[i] for i in sorted(result.assignment)]  # type: ignore[attr-defined]


class TestPack:
    def test_all_bundles_on_one_node_when_they_fit(self) -> None:
        """PACK puts every bundle on the node that takes most of them."""
        [r] = place_groups([group(PACK, 1, 1, 1)], [node("a", 2), node("b", 4)])
        assert r.outcome is Outcome.PLACED and nodes_of(r) == [b"b"] * 3

    def test_spills_to_more_nodes_when_none_holds_all(self) -> None:
        """PACK is soft: 3 x 2 CPU over two 4-CPU nodes uses both."""
        [r] = place_groups([group(PACK, 2, 2, 2)], [node("a"), node("b")])
        assert r.outcome is Outcome.PLACED and sorted(nodes_of(r)) == [b"a", b"a", b"b"]


class TestSpread:
    def test_distinct_nodes_when_possible(self) -> None:
        """SPREAD uses a fresh node for each bundle while one fits."""
        [r] = place_groups([group(SPREAD, 1, 1)], [node("a"), node("b")])
        assert sorted(nodes_of(r)) == [b"a", b"b"]

    def test_groups_go_to_the_least_loaded_nodes_as_rays_scorer_does(self) -> None:
        """Ray's ``LeastResourceScorer``: each bundle on the node left with the largest share
        of the demanded resources free, so successive spread groups cover the cluster rather
        than pile onto its first nodes (issue 30: every bundle adds 4 names to its node's
        resource view, which the syncer relays to every raylet)."""
        from collections import Counter

        for strategy in (SPREAD, STRICT_SPREAD):
            nodes = [node(n, 8) for n in "abcd"]
            results = place_groups([group(strategy, 1, 1) for _ in range(10)], nodes)
            used = Counter(n for r in results for n in nodes_of(r))
            assert used == {b"a": 5, b"b": 5, b"c": 5, b"d": 5}
            [r] = place_groups([group(strategy, 1)], [node("a", 2, 8), node("b", 6, 8)])
            assert nodes_of(r) == [b"b"]

    def test_reuses_nodes_evenly_when_too_few(self) -> None:
        """SPREAD is soft: 4 bundles on 2 nodes still place, two on each."""
        [r] = place_groups([group(SPREAD, 1, 1, 1, 1)], [node("a"), node("b")])
        assert r.outcome is Outcome.PLACED and sorted(nodes_of(r)) == [b"a", b"a", b"b", b"b"]


class TestStrictPack:
    def test_one_node_holds_the_sum(self) -> None:
        """STRICT_PACK needs one node with the sum of the bundles."""
        [r] = place_groups([group(STRICT_PACK, 2, 2)], [node("a", 2), node("b", 4)])
        assert nodes_of(r) == [b"b", b"b"]

    def test_soft_target_node_preferred(self) -> None:
        """``soft_target_node_id`` wins among nodes that fit."""
        g = group(STRICT_PACK, 1, soft_target_node_id=b"b")
        [r] = place_groups([g], [node("a"), node("b")])
        assert nodes_of(r) == [b"b"]

    def test_no_single_node_is_no_resources_or_infeasible(self) -> None:
        """Sum fits no node's free room but a node's total: no resources; else infeasible."""
        [busy] = place_groups([group(STRICT_PACK, 2, 2)], [node("a", 1, total=4), node("b", 2)])
        assert busy.outcome is Outcome.NO_RESOURCES and "STRICT_PACK" in busy.reason
        [never] = place_groups([group(STRICT_PACK, 2, 2)], [node("a", 2), node("b", 2)])
        assert never.outcome is Outcome.INFEASIBLE


class TestStrictSpread:
    def test_each_bundle_on_its_own_node(self) -> None:
        """STRICT_SPREAD uses as many nodes as bundles."""
        [r] = place_groups([group(STRICT_SPREAD, 1, 1, 1)], [node("a"), node("b"), node("c")])
        assert sorted(nodes_of(r)) == [b"a", b"b", b"c"]

    def test_too_few_nodes_is_infeasible(self) -> None:
        """3 bundles, 2 nodes: can never be placed on this cluster."""
        [r] = place_groups([group(STRICT_SPREAD, 1, 1, 1)], [node("a"), node("b")])
        assert r.outcome is Outcome.INFEASIBLE and r.assignment == {}

    def test_rescheduled_bundle_avoids_the_survivors_nodes(self) -> None:
        """Only the lost bundle is placed, on a node no surviving bundle uses."""
        bundles = (
            BundleDemand(0, {"CPU": 1}, node_id=b"a"),
            BundleDemand(1, {"CPU": 1}),
            BundleDemand(2, {"CPU": 1}, node_id=b"b"),
        )
        g = GroupRequest(b"pg", STRICT_SPREAD, bundles)
        [r] = place_groups([g], [node("a"), node("b"), node("c")])
        assert r.outcome is Outcome.PLACED and dict(r.assignment) == {1: b"c"}
        [none] = place_groups([g], [node("a"), node("b")])
        assert none.outcome is Outcome.INFEASIBLE


class TestLabels:
    def test_bundle_selector_restricts_nodes(self) -> None:
        """A bundle with ``{"zone": "b"}`` only goes to zone b, even for PACK."""
        sel = selector_from_map({"zone": "b"})
        bundles = (BundleDemand(0, {"CPU": 1}), BundleDemand(1, {"CPU": 1}, sel))
        g = GroupRequest(b"pg", PACK, bundles)
        [r] = place_groups([g], [node("a", zone="a"), node("b", zone="b")])
        assert r.assignment[1] == b"b"

    def test_not_in_and_in_list(self) -> None:
        """``!a`` and ``in(b,c)`` are honoured; no matching node is infeasible."""
        bundles = (BundleDemand(0, {"CPU": 1}, selector_from_map({"zone": "!a"})),)
        [r] = place_groups([GroupRequest(b"pg", PACK, bundles)], [node("a", zone="a")])
        assert r.outcome is Outcome.INFEASIBLE
        bundles = (BundleDemand(0, {"CPU": 1}, selector_from_map({"zone": "in(b,c)"})),)
        [r] = place_groups(
            [GroupRequest(b"pg", PACK, bundles)], [node("a", zone="a"), node("c", zone="c")]
        )
        assert nodes_of(r) == [b"c"]


class TestVirtualClustersAndPasses:
    def test_group_sees_only_its_virtual_cluster(self) -> None:
        """``allowed`` restricts the candidates; outside nodes never get bundles."""
        g = group(STRICT_SPREAD, 1, 1, allowed=frozenset({b"b", b"c"}))
        [r] = place_groups([g], [node("a"), node("b"), node("c")])
        assert sorted(nodes_of(r)) == [b"b", b"c"]
        g2 = group(STRICT_SPREAD, 1, 1, allowed=frozenset({b"b"}))
        [r2] = place_groups([g2], [node("a"), node("b"), node("c")])
        assert r2.outcome is Outcome.INFEASIBLE

    def test_later_groups_see_what_earlier_ones_took(self) -> None:
        """Two 3-CPU groups on one 4-CPU node: the second has to wait."""
        a = GroupRequest(b"g1", PACK, (BundleDemand(0, {"CPU": 3}),))
        b = GroupRequest(b"g2", PACK, (BundleDemand(0, {"CPU": 3}),))
        r1, r2 = place_groups([a, b], [node("n")])
        assert r1.outcome is Outcome.PLACED and r2.outcome is Outcome.NO_RESOURCES

    def test_unknown_resource_is_infeasible(self) -> None:
        """A GPU bundle on CPU-only nodes can never be placed (the autoscaler must add)."""
        g = GroupRequest(b"pg", PACK, (BundleDemand(0, {"GPU": 1}),))
        [r] = place_groups([g], [node("a")])
        assert r.outcome is Outcome.INFEASIBLE


def _random_case(data: st.DataObject) -> tuple[list[GroupRequest], list[NodeView]]:
    n_nodes = data.draw(st.integers(1, 8))
    kinds = data.draw(
        st.lists(
            st.sampled_from([(2.0, "a"), (4.0, "a"), (4.0, "b")]),
            min_size=n_nodes,
            max_size=n_nodes,
        )
    )
    nodes = []
    for i, (cpu, zone) in enumerate(kinds):
        free = data.draw(st.sampled_from([cpu, cpu / 2, 0.0]))
        nodes.append(NodeView(bytes([i]) * 28, {"CPU": free}, {"CPU": cpu}, {"zone": zone}))
    groups = []
    for g in range(data.draw(st.integers(1, 4))):
        bundles = []
        for j in range(data.draw(st.integers(1, 4))):
            sel = data.draw(st.sampled_from([(), selector_from_map({"zone": "b"})]))
            placed = data.draw(st.sampled_from([b"", b"", nodes[0].node_id]))
            bundles.append(
                BundleDemand(j, {"CPU": data.draw(st.sampled_from([1.0, 2.0]))}, sel, placed)
            )
        allowed = data.draw(st.sampled_from([None, frozenset(n.node_id for n in nodes[::2])]))
        strategy = data.draw(st.sampled_from([PACK, SPREAD, STRICT_PACK, STRICT_SPREAD]))
        groups.append(GroupRequest(bytes([g]) * 18, strategy, tuple(bundles), allowed=allowed))
    return groups, nodes


class TestInvariants:
    @settings(deadline=None)
    @given(st.data())
    def test_every_placement_obeys_resources_labels_strategy_and_cluster(
        self, data: st.DataObject
    ) -> None:
        """Placed groups never overcommit a node (earlier groups included), honour
        selectors, the strategy and the virtual cluster; identical input, identical output."""
        groups, nodes = _random_case(data)
        results = place_groups(groups, nodes)
        assert results == place_groups(groups, nodes)
        by_id = {n.node_id: n for n in nodes}
        used = {n.node_id: 0.0 for n in nodes}
        for group, result in zip(groups, results, strict=True):
            todo = {b.index: b for b in group.bundles if not b.node_id}
            if result.outcome is not Outcome.PLACED:
                assert result.assignment == {} and result.reason
                continue
            assert set(result.assignment) == set(todo)
            for index, nid in result.assignment.items():
                assert group.allowed is None or nid in group.allowed
                assert matches(todo[index].selector, by_id[nid].labels)
                used[nid] += todo[index].resources["CPU"]
            chosen = list(result.assignment.values())
            survivors = {b.node_id for b in group.bundles if b.node_id}
            if group.strategy == STRICT_SPREAD:
                assert len(set(chosen)) == len(chosen) and not survivors & set(chosen)
            if group.strategy == STRICT_PACK and chosen:
                assert len(set(chosen)) == 1 and (not survivors or set(chosen) <= survivors)
        for nid, amount in used.items():
            assert amount <= by_id[nid].available["CPU"] + 1e-9
