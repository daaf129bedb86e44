"""Dead-node replacement (reference §5, S1-S4; quirks Q5 and Q6 not copied)."""

from __future__ import annotations

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID as P
from gcs.policy.virtual_clusters.ids import UNDIVIDED
from tests.virtual_clusters.conftest import Harness, nid


def first(h: Harness, cluster_id: str, bucket: str | None = None) -> str:
    cluster = h.registry.get(cluster_id)
    return sorted(n for n, b in cluster.members.items() if bucket in (None, b))[0]


class TestReplenish:
    def test_s1_indivisible_gets_a_primary_spare_and_publishes(self) -> None:
        """S1: the dead node moves to P, a spare of its type joins; flushed and published,
        with a new revision (ant-ray keeps it: an update at the old one would pass)."""
        h = Harness(6, 2)
        rev = h.create("v", {"0": 1, "1": 1}, divisible=False).revision
        dead = first(h, "v")
        h.kill(dead)
        plan = h.run(h.registry.replenish())
        assert dead not in h.registry.get("v").members
        assert h.registry.primary.members[dead] == UNDIVIDED
        assert h.counts("v") == {"0": 1, "1": 1} and len(h.alive("v")) == 2
        assert set(plan.puts) == {"v"} and [m.id for m in plan.publishes] == ["v"]
        assert h.registry.get("v").revision > rev
        assert plan.puts["v"].revision == plan.publishes[0].revision == h.registry.get("v").revision
        h.sound()

    def test_s2_job_cluster_falls_back_to_the_parents_spare(self) -> None:
        """S2/Q5: no primary spare: J takes V's undivided spare and V keeps the dead node."""
        h = Harness(3, 1)
        h.create("v", {"0": 3})
        jc = h.job("v", "j", {"0": 1})
        dead = first(h, jc)
        h.kill(dead)
        plan = h.run(h.registry.replenish())
        job = h.registry.get(jc)
        assert dead not in job.members and len(h.alive(jc)) == 1
        (spare,) = job.members
        assert h.registry.get("v").members[spare] == jc
        assert h.registry.get("v").members[dead] == UNDIVIDED
        assert set(plan.puts) == {"v", jc} and [m.id for m in plan.publishes] == [jc]
        h.sound()

    def test_job_cluster_prefers_the_primary(self) -> None:
        """A job cluster replaces from the primary first; the dead node leaves its parent."""
        h = Harness(4, 1)
        h.create("v", {"0": 2})
        jc = h.job("v", "j", {"0": 1})
        dead = first(h, jc)
        h.kill(dead)
        h.run(h.registry.replenish())
        assert dead in h.registry.primary.members
        assert dead not in h.registry.get("v").members
        assert h.counts("v") == {"0": 2}
        h.sound()

    def test_s3_divisible_undivided_node_is_flushed_not_published(self) -> None:
        """S3."""
        h = Harness(4, 1)
        h.create("v", {"0": 2})
        h.kill(first(h, "v"))
        plan = h.run(h.registry.replenish())
        assert set(plan.puts) == {"v"} and plan.publishes == ()
        assert len(h.alive("v")) == 2

    def test_s4_dead_primary_nodes_are_left_alone(self) -> None:
        """S4/Q6: nothing happens to dead undivided primary nodes (count kept)."""
        h = Harness(4, 1)
        h.kill(nid(0))
        plan = h.run(h.registry.replenish())
        assert plan.empty
        assert h.counts(P) == {"0": 4}

    def test_no_donor_no_change(self) -> None:
        """Without an alive node of the type nothing moves until one joins."""
        h = Harness(2, 2)
        h.create("v", {"0": 1}, divisible=False)
        dead = first(h, "v")
        h.kill(dead)
        assert h.registry.replenish().empty
        h.join(nid(99), "0")
        h.run(h.registry.replenish())
        assert h.alive("v") == [nid(99)]

    def test_one_dead_node_per_template_per_round(self) -> None:
        """ant-ray's pace: one replacement per template and cluster each round."""
        h = Harness(6, 1)
        h.create("v", {"0": 2}, divisible=False)
        for node_id in list(h.registry.get("v").members):
            h.kill(node_id)
        h.run(h.registry.replenish())
        assert len(h.alive("v")) == 1
        h.run(h.registry.replenish())
        assert len(h.alive("v")) == 2

    def test_primary_job_cluster_replaced_from_the_primary(self) -> None:
        """A job cluster of the primary swaps buckets inside the primary."""
        h = Harness(3, 1)
        jc = h.job(P, "j", {"0": 1})
        dead = first(h, jc)
        h.kill(dead)
        plan = h.run(h.registry.replenish())
        assert h.registry.primary.members[dead] == UNDIVIDED
        assert len(h.alive(jc)) == 1
        assert set(plan.puts) == {jc}
        h.sound()
