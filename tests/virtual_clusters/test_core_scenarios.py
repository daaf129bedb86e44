"""Reference §14.1 (ant-ray gcs_virtual_cluster_manager_test.cc) against the pure model."""

from __future__ import annotations

import pytest

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID as P
from gcs.policy.virtual_clusters.errors import VcNotFound, VcOutOfResource, VcUnsafeToRemove
from gcs.policy.virtual_clusters.ids import UNDIVIDED
from tests.virtual_clusters.conftest import Harness

J0 = f"{P}##job_0"
J1 = f"{P}##job_1"


def buckets(h: Harness, cluster_id: str, template: str) -> dict[str, int]:
    cluster = h.registry.get(cluster_id)
    out: dict[str, int] = {}
    for node_id, bucket in cluster.members.items():
        if h.registry.node(node_id).template_id == template:
            out[bucket] = out.get(bucket, 0) + 1
    return out


class TestPrimaryNodes:
    def test_c1_nodes_land_in_the_primarys_undivided_bucket(self, h200: Harness) -> None:
        """C1: 200/10 gives 10 templates of 20 undivided alive nodes."""
        assert h200.counts(P) == {str(t): 20 for t in range(10)}
        assert all(buckets(h200, P, str(t)) == {UNDIVIDED: 20} for t in range(10))
        assert len(h200.alive(P)) == 200

    def test_c2_c3_dead_nodes_stay_listed(self, h200: Harness) -> None:
        """C2/C3: marking nodes dead keeps their entries; only the alive count drops."""
        per_template: dict[str, list[str]] = {}
        for node in h200.registry.nodes():
            per_template.setdefault(node.template_id, []).append(node.node_id)
        for ids in per_template.values():
            for node_id in ids[8:]:
                h200.kill(node_id)
        assert h200.counts(P) == {str(t): 20 for t in range(10)}
        assert len(h200.alive(P)) == 80
        for ids in per_template.values():
            for node_id in ids[:8]:
                h200.kill(node_id)
        assert h200.counts(P) == {str(t): 20 for t in range(10)}
        assert h200.alive(P) == []


class TestLogicalClusters:
    def test_c4_create_moves_nodes_from_the_primary(self, h200: Harness) -> None:
        """C4: vc0 {0:5, 1:10} takes its nodes from P's undivided bucket."""
        result = h200.create("vc0", {"0": 5, "1": 10})
        assert h200.counts("vc0") == {"0": 5, "1": 10}
        assert result.revision > 0
        assert buckets(h200, P, "0") == {UNDIVIDED: 15}
        assert buckets(h200, P, "1") == {UNDIVIDED: 10}
        h200.sound()

    def test_c5_c6_c7_exhaust_templates_then_fail(self, h200: Harness) -> None:
        """C5-C7: vc1 drains templates 0/1; a zero request succeeds empty; vc3 fails."""
        h200.create("vc0", {"0": 5, "1": 10})
        h200.create("vc1", {"0": 15, "1": 10})
        assert h200.counts("vc1") == {"0": 15, "1": 10}
        assert set(h200.counts(P)) == {str(t) for t in range(2, 10)}
        h200.create("vc2", {"0": 0, "1": 0})
        assert h200.registry.get("vc2") is not None
        assert h200.counts("vc2") == {}  # Q12 not copied: no empty template entries
        with pytest.raises(VcOutOfResource):
            h200.registry.create_or_update("vc3", True, {"0": 5, "1": 10})
        assert h200.registry.get("vc3") is None


class TestJobClustersOfThePrimary:
    def test_c8_job_cluster_borrows_primary_nodes(self, h200: Harness) -> None:
        """C8: the job cluster holds the nodes; P lends them in a job bucket."""
        h200.job(P, "job_0", {"0": 5, "1": 10})
        assert h200.counts(J0) == {"0": 5, "1": 10}
        assert buckets(h200, P, "0") == {J0: 5, UNDIVIDED: 15}
        assert buckets(h200, P, "1") == {J0: 10, UNDIVIDED: 10}
        h200.sound()

    def test_c9_second_job_empties_the_undivided_bucket(self, h200: Harness) -> None:
        """C9: job_1 {0:15, 1:10} leaves no undivided node of templates 0/1."""
        h200.job(P, "job_0", {"0": 5, "1": 10})
        h200.job(P, "job_1", {"0": 15, "1": 10})
        assert buckets(h200, P, "0") == {J0: 5, J1: 15}
        assert buckets(h200, P, "1") == {J0: 10, J1: 10}

    def test_c10_c11_remove_job_cluster_returns_nodes(self, h200: Harness) -> None:
        """C10/C11: removal publishes is_removed and returns nodes; a second one is NotFound."""
        h200.job(P, "job_0", {"0": 5, "1": 10})
        plan = h200.run(h200.registry.remove(J0))
        assert [(m.id, m.is_removed) for m in plan.publishes] == [(J0, True)]
        assert h200.registry.get(J0) is None
        assert buckets(h200, P, "0") == {UNDIVIDED: 20}
        with pytest.raises(VcNotFound, match="does not exist"):
            h200.registry.remove(J1)


class TestRemoveLogical:
    def test_c12_c13_remove_returns_nodes_then_not_found(self, h200: Harness) -> None:
        """C12/C13: vc0's nodes return to P; removing again is NotFound."""
        h200.create("vc0", {"0": 5, "1": 10})
        plan = h200.run(h200.registry.remove("vc0"))
        assert plan.deletes == {"vc0"}
        assert plan.publishes == ()  # divisible: never published
        assert buckets(h200, P, "0") == {UNDIVIDED: 20}
        with pytest.raises(VcNotFound):
            h200.registry.remove("vc0")


class TestGetVirtualClusters:
    @pytest.fixture
    def c14(self, h200: Harness) -> Harness:
        h200.create("vc0", {"0": 5, "1": 5})
        h200.create("vc1", {"0": 5, "1": 5})
        h200.job(P, "job0", {"0": 10, "1": 10})
        h200.job("vc0", "job_1", {"0": 2, "1": 2})
        return h200

    def ids(self, h: Harness, *args) -> list[str]:  # type: ignore[no-untyped-def]
        return sorted(d.id for d in h.registry.get_virtual_clusters(*args))

    def test_c14_single_cluster_without_jobs(self, c14: Harness) -> None:
        """C14: only vc0."""
        assert self.ids(c14, "vc0", False, False) == ["vc0"]

    def test_c15_with_its_job_clusters(self, c14: Harness) -> None:
        """C15: vc0 and its job cluster."""
        assert self.ids(c14, "vc0", True, False) == ["vc0", "vc0##job_1"]

    def test_c16_only_indivisible(self, c14: Harness) -> None:
        """C16: the job cluster only."""
        assert self.ids(c14, "vc0", True, True) == ["vc0##job_1"]


class TestRemoveNodes:
    def test_c17_c18_remove_specific_nodes_then_fail_on_repeat(self, h200: Harness) -> None:
        """C17/C18: 5 t1 nodes go back to P; repeating names exactly those 5 as failures."""
        h200.create("vc0", {"0": 5, "1": 10})
        t1 = [n for n in h200.alive("vc0") if h200.registry.node(n).template_id == "1"][:5]
        h200.run(h200.registry.remove_nodes("vc0", t1))
        assert buckets(h200, P, "1") == {UNDIVIDED: 15}
        assert h200.counts("vc0") == {"0": 5, "1": 5}
        assert not set(t1) & set(h200.registry.get("vc0").members)
        with pytest.raises(VcUnsafeToRemove) as err:
            h200.registry.remove_nodes("vc0", t1)
        assert err.value.nodes_with_failure == t1
