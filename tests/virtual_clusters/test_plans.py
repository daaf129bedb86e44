"""Operations are transactional: plan first, commit only what was persisted."""

from __future__ import annotations

import pytest

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID as P
from gcs.policy.virtual_clusters import NodeInstance, StalePlan
from gcs.policy.virtual_clusters.errors import VcError
from tests.virtual_clusters.conftest import Harness, nid


@pytest.fixture
def h() -> Harness:
    return Harness(12, 2)


class TestTransactions:
    def test_a_plan_changes_nothing_until_committed(self, h: Harness) -> None:
        """Discarding a plan (e.g. the store write failed) leaves the registry as it was."""
        before = (h.layout(), dict(h.registry.primary.members), h.registry.generation)
        result = h.registry.create_or_update("v", False, {"0": 2})
        assert result.plan.puts and result.plan.publishes
        assert (h.layout(), dict(h.registry.primary.members), h.registry.generation) == before

    def test_a_failed_operation_changes_nothing(self, h: Harness) -> None:
        """Errors are raised before any change."""
        h.create("v", {"0": 2})
        before = (h.layout(), dict(h.registry.primary.members), h.registry.generation)
        with pytest.raises(VcError):
            h.registry.create_or_update("v", True, {"0": 2, "1": 50}, h.registry.get("v").revision)
        assert (h.layout(), dict(h.registry.primary.members), h.registry.generation) == before

    def test_a_plan_from_an_older_generation_is_refused(self, h: Harness) -> None:
        """Interleaved mutations are caught: the second commit raises StalePlan."""
        first = h.registry.create_or_update("a", True, {"0": 1})
        second = h.registry.create_or_update("b", True, {"0": 1})
        h.run(first)
        with pytest.raises(StalePlan):
            h.registry.commit(second.plan)

    def test_adding_a_node_twice_counts_once(self, h: Harness) -> None:
        """Q8 not copied: a repeated node add is a no-op."""
        assert h.registry.add_node(NodeInstance(nid(0), "0")).empty
        assert h.counts(P) == {"0": 6, "1": 6}


class TestFlushAndPublishTable:
    def test_indivisible_create_is_put_and_published(self, h: Harness) -> None:
        """§6: indivisible logical: Put + publish a full snapshot."""
        result = h.create("v", {"0": 2}, divisible=False)
        (message,) = result.plan.publishes
        assert set(result.plan.puts) == {"v"}
        assert message.revision == result.revision and len(message.node_instances) == 2
        assert {i.template_id for i in message.node_instances.values()} == {"0"}
        assert {i.hostname for i in result.node_instances.values()} == {"h"}  # D1

    def test_divisible_create_is_put_only(self, h: Harness) -> None:
        """§6: divisible logical: Put, no publish."""
        result = h.create("v", {"0": 2})
        assert set(result.plan.puts) == {"v"} and result.plan.publishes == ()

    def test_divisible_remove_is_delete_only(self, h: Harness) -> None:
        """§6: divisible remove: Delete, no publish."""
        h.create("v", {"0": 2})
        plan = h.run(h.registry.remove("v"))
        assert (plan.deletes, dict(plan.puts), plan.publishes) == ({"v"}, {}, ())

    def test_the_primary_is_never_persisted(self, h: Harness) -> None:
        """§6: the primary never appears in puts, deletes or publishes."""
        plans = [
            h.create("v", {"0": 2}).plan,
            h.run(h.registry.create_job_cluster(P, "j", {"1": 1})).plan,
            h.run(h.registry.remove(f"{P}##j")),
            h.run(h.registry.remove("v")),
        ]
        for plan in plans:
            assert P not in plan.puts and P not in plan.deletes
            assert all(m.id != P for m in plan.publishes)

    def test_store_mirrors_the_registry(self, h: Harness) -> None:
        """After committed plans the fake store equals ``registry.records()``."""
        h.create("a", {"0": 2})
        h.create("b", {"1": 2}, divisible=False)
        h.job("a", "j", {"0": 1})
        h.run(h.registry.remove_nodes("b", [sorted(h.registry.get("b").members)[0]]))
        assert {
            k: v.SerializeToString(deterministic=True) for k, v in h.registry.records().items()
        } == h.store


class TestPublicNames:
    def test_package_exports_are_pinned(self) -> None:
        """The public surface of ``gcs.policy.virtual_clusters`` is exactly this list."""
        import gcs.policy.virtual_clusters as vc

        assert set(vc.__all__) == {
            "PRIMARY_CLUSTER_ID",
            "Cluster",
            "CreateJobClusterResult",
            "CreateOrUpdateResult",
            "Kind",
            "NodeInstance",
            "NodeView",
            "Plan",
            "ReplayOutcome",
            "RevisionSource",
            "StalePlan",
            "StaticUsage",
            "UsageView",
            "VcError",
            "VcStatusCode",
            "VirtualClusterRegistry",
            "build_job_cluster_id",
            "is_job_cluster_id",
            "replay",
        }
        assert all(hasattr(vc, name) for name in vc.__all__)
