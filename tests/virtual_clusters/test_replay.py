"""GCS failover: replay and repair (reference §7, C19-C23)."""

from __future__ import annotations

import pytest

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID as P
from gcs.policy.virtual_clusters.ids import UNDIVIDED
from gcs.proto.virtual_cluster_data_pb2 import VirtualClusterTableData
from tests.virtual_clusters.conftest import Harness

J0 = f"{P}##job_0"
J1 = "vc1##job_1"


def first_of(h: Harness, cluster_id: str, template: str, bucket: str | None = None) -> str:
    cluster = h.registry.get(cluster_id)
    return sorted(
        n
        for n, b in cluster.members.items()
        if h.registry.node(n).template_id == template and bucket in (None, b)
    )[0]


@pytest.fixture
def c19() -> Harness:
    """40/2; vc1 divisible, vc2 indivisible (Q1 not copied) {0:5, 1:5}; two job clusters."""
    h = Harness(40, 2)
    h.create("vc1", {"0": 5, "1": 5})
    h.create("vc2", {"0": 5, "1": 5}, divisible=False)
    h.job(P, "job_0", {"0": 4, "1": 4})
    h.job("vc1", "job_1", {"0": 4, "1": 4})
    return h


def kill_c21(h: Harness) -> list[str]:
    dead = [
        first_of(h, J0, "0"),
        first_of(h, J1, "0"),
        first_of(h, "vc1", "1", UNDIVIDED),
        first_of(h, "vc2", "1"),
    ]
    for node_id in dead:
        h.kill(node_id)
    return dead


class TestFailover:
    def test_c19_flushed_records(self, c19: Harness) -> None:
        """C19: exactly the 4 non-primary clusters are stored."""
        assert sorted(c19.store) == sorted(["vc1", "vc2", J0, J1])

    def test_c20_replay_restores_everything(self, c19: Harness) -> None:
        """C20: P and every VC equal the original, with their revisions."""
        before, primary = c19.layout(), dict(c19.registry.primary.members)
        revisions = {c.id: c.revision for c in c19.registry.clusters() if c.id != P}
        outcome = c19.restart()
        assert (outcome.puts, outcome.deletes, outcome.warnings) == ({}, set(), [])
        assert c19.layout() == before
        assert dict(c19.registry.primary.members) == primary
        assert {c.id: c.revision for c in c19.registry.clusters() if c.id != P} == revisions
        c19.sound()

    def test_c21_dead_nodes_gone_from_the_node_table(self, c19: Harness) -> None:
        """C21: layout restored and the dropped nodes come back dead."""
        dead = kill_c21(c19)
        before = c19.layout()
        c19.restart(drop=frozenset(dead))
        assert c19.layout() == before
        assert all(c19.registry.node(n).is_dead for n in dead)
        c19.sound()

    def test_c22_replenished_and_flushed(self, c19: Harness) -> None:
        """C22: after a flushed replenish, VCs equal the pre-restart ones; P only shrinks."""
        dead = kill_c21(c19)
        c19.run(c19.registry.replenish())
        before, primary = c19.layout(), set(c19.registry.primary.members)
        c19.restart(drop=frozenset(dead))
        assert c19.layout() == before
        assert set(c19.registry.primary.members) <= primary
        c19.sound()

    def test_c23_repair_when_the_parent_flush_was_lost(self, c19: Harness) -> None:
        """C23: only job_1's record was written after replenishing it from P."""
        dead = kill_c21(c19)
        dead2, dead3 = dead[1], dead[2]
        plan = c19.registry.replenish()
        c19.store[J1] = plan.puts[J1].SerializeToString()  # vc1's Put was lost
        old_rev = c19.registry.get("vc1").revision
        outcome = c19.restart(drop=frozenset(dead))
        job, vc1 = c19.registry.get(J1), c19.registry.get("vc1")
        assert dead2 not in job.members
        assert dead2 not in vc1.members
        assert dead3 in vc1.members
        assert all(vc1.members[n] == J1 for n in job.members)
        assert set(outcome.puts) == {"vc1"} and outcome.puts["vc1"].revision > old_rev
        c19.sound()

    def test_revisions_never_go_back_even_if_the_clock_does(self, c19: Harness) -> None:
        """After restart with an earlier clock, new revisions exceed every stored one."""
        highest = max(c.revision for c in c19.registry.clusters())
        c19.restart(clock_start=0)
        assert c19.registry.primary.revision > highest
        rev = c19.update("vc2", {"0": 5, "1": 4}).revision
        assert rev > highest

    def test_orphan_job_record_is_deleted(self, c19: Harness) -> None:
        """A job record without a divisible parent is deleted instead of aborting."""
        c19.store["ghost##j"] = VirtualClusterTableData(id="ghost##j").SerializeToString()
        outcome = c19.restart()
        assert outcome.deletes == {"ghost##j"}
        assert "ghost##j" not in c19.store
        c19.sound()

    def test_a_node_claimed_twice_stays_with_the_first(self, c19: Harness) -> None:
        """Two logical records naming one node: the later record drops it and is re-put."""
        stolen = sorted(c19.registry.get("vc1").undivided())[-1]
        vc2 = VirtualClusterTableData.FromString(c19.store["vc2"])
        vc2.node_instances[stolen].template_id = "0"
        c19.store["vc2"] = vc2.SerializeToString()
        outcome = c19.restart()
        assert stolen in c19.registry.get("vc1").members
        assert stolen not in c19.registry.get("vc2").members
        assert "vc2" in outcome.puts and outcome.warnings
        c19.sound()
