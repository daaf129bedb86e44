"""Property test: random VC operations, node churn, jobs and restarts keep the invariants."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID as P
from gcs.policy.virtual_clusters import Kind, StaticUsage
from gcs.policy.virtual_clusters.errors import VcError, VcOutOfResource, VcUnsafeToRemove
from tests.virtual_clusters.conftest import Harness, nid

TEMPLATES = ("a", "b", "c")
NAMES = ("v0", "v1", "v2")
counts = st.dictionaries(st.sampled_from(TEMPLATES), st.integers(0, 3), max_size=3)


class VirtualClusterMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness()
        self.next_node = 0

    def snapshot(self) -> tuple:
        return (self.h.layout(), dict(self.h.registry.primary.members), self.h.registry.generation)

    def attempt(self, build) -> bool:  # type: ignore[no-untyped-def]
        """Run a planner; on VcError nothing may have changed."""
        before = self.snapshot()
        try:
            self.h.run(build())
        except VcError:
            assert self.snapshot() == before
            return False
        return True

    @rule(template=st.sampled_from(TEMPLATES))
    def node_join(self, template: str) -> None:
        self.h.join(nid(self.next_node), template)
        self.next_node += 1

    @rule(pick=st.integers(0, 1000))
    def node_death(self, pick: int) -> None:
        alive = [n.node_id for n in self.h.registry.nodes() if not n.is_dead]
        if alive:
            self.h.kill(alive[pick % len(alive)])

    @rule(
        name=st.sampled_from(NAMES),
        divisible=st.booleans(),
        wanted=counts,
        stale=st.booleans(),
        busy=st.booleans(),
    )
    def create_or_update(
        self, name: str, divisible: bool, wanted: dict[str, int], stale: bool, busy: bool
    ) -> None:
        current = self.h.registry.get(name)
        revision = current.revision + (1 if stale else 0) if current else 0
        nodes = self.h.registry.nodes()
        usage = StaticUsage(busy_nodes={n.node_id for n in nodes} if busy else set())
        alive_free = {
            t: sum(
                1
                for n in self.h.registry.primary.undivided()
                if not self.h.registry.node(n).is_dead and self.h.registry.node(n).template_id == t
            )
            for t in TEMPLATES
        }
        have = self.h.counts(name) if current else {}
        try:
            result = self.h.registry.create_or_update(name, divisible, wanted, revision, usage)
        except VcOutOfResource as err:
            short = {t: wanted[t] - have.get(t, 0) for t in err.replica_sets_to_recommend}
            assert any(err.replica_sets_to_recommend[t] == alive_free[t] < short[t] for t in short)
            return
        except VcUnsafeToRemove:
            assert current is not None and (busy or current.divisible)
            return
        except VcError:
            assert current is not None and (stale or divisible != current.divisible)
            return
        assert not (current and stale)
        self.h.run(result)
        assert self.h.counts(name) == {t: n for t, n in wanted.items() if n}

    @rule(target_pick=st.integers(0, 100), busy=st.booleans())
    def remove(self, target_pick: int, busy: bool) -> None:
        ids = [c.id for c in self.h.registry.clusters() if c.id != P]
        if not ids:
            return
        target = ids[target_pick % len(ids)]
        usage = StaticUsage(busy_clusters={target} if busy else set())
        removed = self.attempt(lambda: self.h.registry.remove(target, usage))
        assert removed == (self.h.registry.get(target) is None)

    @rule(parent=st.sampled_from((P, *NAMES)), job=st.sampled_from(("j0", "j1")), wanted=counts)
    def job_add(self, parent: str, job: str, wanted: dict[str, int]) -> None:
        if self.attempt(lambda: self.h.registry.create_job_cluster(parent, job, wanted)):
            assert self.h.counts(f"{parent}##{job}") == {t: n for t, n in wanted.items() if n}

    @rule(pick=st.integers(0, 100), busy=st.booleans())
    def job_finish(self, pick: int, busy: bool) -> None:
        jobs = [c.id for c in self.h.registry.clusters() if c.kind is Kind.JOB]
        if jobs:
            target = jobs[pick % len(jobs)]
            usage = StaticUsage(busy_clusters={target} if busy else set())
            self.attempt(lambda: self.h.registry.on_job_finished(target, usage))

    @rule()
    def gc(self) -> None:
        self.attempt(self.h.registry.collect_expired_job_clusters)

    @rule()
    def replenish(self) -> None:
        self.attempt(self.h.registry.replenish)

    @rule(name=st.sampled_from(NAMES), take=st.integers(0, 3))
    def remove_nodes(self, name: str, take: int) -> None:
        cluster = self.h.registry.get(name)
        nodes = sorted(cluster.members)[:take] if cluster else []
        self.attempt(lambda: self.h.registry.remove_nodes(name, nodes))

    @rule()
    def restart(self) -> None:
        before = self.h.layout()
        revisions = {c.id: c.revision for c in self.h.registry.clusters() if c.id != P}
        highest = self.h.registry.revisions.last
        # Dead undivided primary nodes are not replayed; dead nodes lent to jobs are.
        alive_primary = {
            n
            for n, bucket in self.h.registry.primary.members.items()
            if bucket != "NIL" or not self.h.registry.node(n).is_dead
        }
        outcome = self.h.restart(clock_start=0)
        assert outcome.warnings == [] and not outcome.puts and not outcome.deletes
        assert self.h.layout() == before
        assert {c.id: c.revision for c in self.h.registry.clusters() if c.id != P} == revisions
        assert set(self.h.registry.primary.members) == alive_primary
        assert self.h.registry.primary.revision > highest

    @rule(kind=st.sampled_from(("replenish", "job")), keep=st.sets(st.integers(0, 5)))
    def crash_mid_write(self, kind: str, keep: set[int]) -> None:
        """A non-atomic store lost some Puts of a plan, then the GCS restarted: replay must
        repair to a sound layout (the ant-ray C23 case, generalised)."""
        try:
            if kind == "replenish":
                plan = self.h.registry.replenish()
            else:
                parent = next((c.id for c in self.h.registry.clusters() if c.divisible), P)
                plan = self.h.registry.create_job_cluster(parent, "crash", {"a": 1}).plan
        except VcError:
            return
        for i, (key, data) in enumerate(sorted(plan.puts.items())):
            if i in keep:
                self.h.store[key] = data.SerializeToString(deterministic=True)
        self.h.restart()
        self.h.sound()
        self.h.store = {
            k: v.SerializeToString(deterministic=True) for k, v in self.h.registry.records().items()
        }

    @invariant()
    def sound(self) -> None:
        self.h.sound()

    @invariant()
    def store_mirrors_registry(self) -> None:
        records = {
            k: v.SerializeToString(deterministic=True) for k, v in self.h.registry.records().items()
        }
        assert records == self.h.store


TestVirtualClusterProperties = VirtualClusterMachine.TestCase
TestVirtualClusterProperties.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
