"""Reference §14.2 RPC-level rules as model tests: status codes and exact messages."""

from __future__ import annotations

import pytest

from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID as P
from gcs.policy.virtual_clusters import StaticUsage, VcStatusCode
from gcs.policy.virtual_clusters.convert import status_proto
from gcs.policy.virtual_clusters.errors import VcError
from tests.virtual_clusters.conftest import Harness


def fails(call, code: VcStatusCode, message: str) -> VcError:  # type: ignore[no-untyped-def]
    with pytest.raises(VcError) as info:
        call()
    assert (info.value.code, info.value.message) == (code, message)
    return info.value


@pytest.fixture
def h() -> Harness:
    return Harness(20, 2)


class TestCreateOrUpdateValidation:
    def test_r1_empty_id(self, h: Harness) -> None:
        """R1: empty id is InvalidArgument with ant-ray's message."""
        fails(
            lambda: h.registry.create_or_update("", True, {}),
            VcStatusCode.InvalidArgument,
            "Invalid request, the virtual cluster id is empty.",
        )

    def test_r2_primary_id(self, h: Harness) -> None:
        """R2: the primary can not be created or updated."""
        fails(
            lambda: h.registry.create_or_update(P, True, {}),
            VcStatusCode.InvalidArgument,
            "Invalid request, kPrimaryClusterID can not be created or updated.",
        )

    def test_r3_negative_replicas(self, h: Harness) -> None:
        """R3: a negative count names the count and the id."""
        fails(
            lambda: h.registry.create_or_update("v", True, {"a": -1}),
            VcStatusCode.InvalidArgument,
            "Invalid request, replicas(-1) must >= 0, virtual_cluster_id: v",
        )

    def test_r4_empty_template(self, h: Harness) -> None:
        """R4: an empty template id is refused."""
        fails(
            lambda: h.registry.create_or_update("v", True, {"": 1}),
            VcStatusCode.InvalidArgument,
            "Invalid request, template_id is empty, virtual_cluster_id: v",
        )

    def test_ids_with_job_separator_are_refused(self, h: Harness) -> None:
        """Q4 not copied: a logical id containing '##' is InvalidArgument."""
        err = fails(
            lambda: h.registry.create_or_update("a##b", True, {}),
            VcStatusCode.InvalidArgument,
            "Invalid request, the virtual cluster id can not contain '##', "
            "virtual_cluster_id: a##b",
        )
        assert err.replica_sets_to_recommend == {}

    def test_r5_divisibility_cannot_flip(self, h: Harness) -> None:
        """R5: expect/actual print as 1/0."""
        current = h.create("v", {"0": 1}).revision
        fails(
            lambda: h.registry.create_or_update("v", False, {"0": 1}, current),
            VcStatusCode.InvalidArgument,
            "The requested attributes are incompatible with virtual cluster v. "
            "expect: (1), actual: (0).",
        )

    def test_r6_stale_revision_changes_nothing(self, h: Harness) -> None:
        """R6: a stale revision fails with the current one in the message."""
        current = h.create("v", {"0": 1}).revision
        before = h.registry.get("v")
        fails(
            lambda: h.registry.create_or_update("v", True, {"0": 2}, 7),
            VcStatusCode.InvalidArgument,
            f"The revision (7) is expired, the latest revision of the virtual cluster v is "
            f"{current}",
        )
        assert h.registry.get("v") is before

    def test_replica_checks_run_before_the_revision_check(self, h: Harness) -> None:
        """Replica-set checks run before the revision check (ant-ray's order)."""
        h.create("v", {"0": 1})
        with pytest.raises(VcError, match=r"replicas\(-2\)"):
            h.registry.create_or_update("v", True, {"0": -2}, 7)


class TestGrowShrink:
    def test_grow_shortfall_recommends_every_requested_template(self, h: Harness) -> None:
        """D6/D7: OutOfResource recommends what could be added, 0 for unknown types; the
        message still holds ant-ray's (D6 looks for it), after naming the unknown type."""
        err = fails(
            lambda: h.registry.create_or_update("v", True, {"0": 11, "1": 1, "16c32g": 1}),
            VcStatusCode.OutOfResource,
            "Unknown node type 16c32g: no node of it has joined and no autoscaler can launch "
            "one (known node types: 0, 1). "
            "No enough nodes to add to the virtual cluster. The replica sets that gcs can add "
            "at most are shown below. Use it as a suggestion to adjust your request or cluster.",
        )
        assert err.replica_sets_to_recommend == {"0": 10, "1": 1, "16c32g": 0}

    def test_update_recommends_only_growing_templates(self, h: Harness) -> None:
        """D10: after vc {0:1}, {0:2, 1:12} recommends {0:1, 1:10}; revision 0 is expired."""
        h.create("v", {"0": 1})
        with pytest.raises(VcError, match=r"The revision \(0\) is expired"):
            h.registry.create_or_update("v", True, {"0": 2, "1": 12}, 0)
        rev = h.registry.get("v").revision
        with pytest.raises(VcError) as info:
            h.registry.create_or_update("v", True, {"0": 2, "1": 12}, rev)
        assert info.value.replica_sets_to_recommend == {"0": 1, "1": 10}

    def test_shrink_of_indivisible_refuses_busy_nodes(self, h: Harness) -> None:
        """D11: shrinking past busy nodes is UnsafeToRemove recommending what is removable."""
        h.create("v", {"0": 2}, divisible=False)
        busy = StaticUsage(busy_nodes=set(h.registry.get("v").members))
        err = fails(
            lambda: h.update("v", {}, usage=busy),
            VcStatusCode.UnsafeToRemove,
            "No enough nodes to remove from the virtual cluster. The replica sets that gcs can "
            "remove at most are shown below. Use it as a suggestion to adjust your request or "
            "cluster.",
        )
        assert err.replica_sets_to_recommend == {"0": 0}

    def test_shrink_takes_dead_nodes_first(self, h: Harness) -> None:
        """Scale-down releases dead undivided nodes before alive ones."""
        h.create("v", {"0": 3}, divisible=False)
        dead = sorted(h.registry.get("v").members)[2]
        h.kill(dead)
        h.update("v", {"0": 2})
        assert dead not in h.registry.get("v").members
        assert dead in h.registry.primary.members

    def test_shrink_never_takes_nodes_lent_to_job_clusters(self, h: Harness) -> None:
        """A divisible cluster shrinks from its undivided nodes only."""
        h.create("v", {"0": 3})
        h.job("v", "j", {"0": 2})
        with pytest.raises(VcError) as info:
            h.update("v", {"0": 0})
        assert info.value.replica_sets_to_recommend == {"0": 1}

    def test_identical_update_still_bumps_revision(self, h: Harness) -> None:
        """D2-D5: every successful update strictly increases the revision."""
        revs = [h.create("v", {"0": 1, "1": 1}, divisible=False).revision]
        for sets in ({"0": 1}, {"0": 1}, {"0": 1, "1": 1}, {}):
            result = h.update("v", sets)
            revs.append(result.revision)
            assert h.counts("v") == {k: v for k, v in sets.items() if v}
            assert len(result.node_instances) == sum(sets.values())
        assert revs == sorted(set(revs))


class TestRemove:
    def test_r7_empty_and_primary(self, h: Harness) -> None:
        """R7: empty id and primary are InvalidArgument."""
        fails(
            lambda: h.registry.remove(""),
            VcStatusCode.InvalidArgument,
            "Invalid request, the virtual cluster id is empty.",
        )
        fails(
            lambda: h.registry.remove(P),
            VcStatusCode.InvalidArgument,
            "Invalid request, kPrimaryClusterID can not be removed.",
        )

    def test_r12_busy_job_cluster_is_invalid(self, h: Harness) -> None:
        """R12: a job cluster with a detached actor is in use: code Invalid (4)."""
        h.create("v", {"0": 2})
        jc = h.job("v", "j", {"0": 1})
        fails(
            lambda: h.registry.remove(jc, StaticUsage(busy_clusters={jc})),
            VcStatusCode.Invalid,
            f"Failed to remove virtual cluster, job cluster is in use, virtual cluster id: {jc}",
        )

    def test_r13_divisible_with_job_cluster_is_unsafe(self, h: Harness) -> None:
        """R13: a divisible cluster with a job cluster is in use (note the trailing space)."""
        h.create("v", {"0": 2})
        h.job("v", "j", {"0": 1})
        fails(
            lambda: h.registry.remove("v"),
            VcStatusCode.UnsafeToRemove,
            "The virtual cluster v can not be removed as it is still in use. ",
        )

    def test_indivisible_with_busy_node_is_unsafe(self, h: Harness) -> None:
        """D15/D16: a busy node blocks removal; once idle the removal succeeds."""
        h.create("v", {"0": 1}, divisible=False)
        (node,) = h.registry.get("v").members
        with pytest.raises(VcError, match="still in use"):
            h.registry.remove("v", StaticUsage(busy_nodes={node}))
        plan = h.run(h.registry.remove("v"))
        assert [(m.id, m.is_removed) for m in plan.publishes] == [("v", True)]

    def test_r14_missing_parent(self, h: Harness) -> None:
        """R14: NotFound naming the job cluster id."""
        fails(
            lambda: h.registry.remove("x##j"),
            VcStatusCode.NotFound,
            "Failed to remove virtual cluster, parent cluster not exists, virtual cluster id: x##j",
        )

    def test_r15_indivisible_parent(self, h: Harness) -> None:
        """R15: a job id under an indivisible cluster is InvalidArgument."""
        h.create("v", {"0": 1}, divisible=False)
        fails(
            lambda: h.registry.remove("v##j"),
            VcStatusCode.InvalidArgument,
            "Failed to remove virtual cluster, parent cluster is not divisible, "
            "virtual cluster id: v##j",
        )

    def test_d13_missing_logical(self, h: Harness) -> None:
        """D13: NotFound ending with 'does not exist.'."""
        fails(
            lambda: h.registry.remove("vc2"),
            VcStatusCode.NotFound,
            "The logical cluster vc2 does not exist.",
        )


class TestCreateJobCluster:
    def test_r8_unknown_parent(self, h: Harness) -> None:
        """R8: NotFound."""
        fails(
            lambda: h.registry.create_job_cluster("nope", "j", {}),
            VcStatusCode.NotFound,
            "virtual cluster not exists: nope",
        )

    def test_r9_indivisible_parent(self, h: Harness) -> None:
        """R9: note the leading space."""
        h.create("v", {"0": 1}, divisible=False)
        fails(
            lambda: h.registry.create_job_cluster("v", "j", {}),
            VcStatusCode.InvalidArgument,
            " virtual cluster is not exclusive: v",
        )

    def test_r10_duplicate_job(self, h: Harness) -> None:
        """R10: the same job twice."""
        h.create("v", {"0": 2})
        h.job("v", "j", {"0": 1})
        fails(
            lambda: h.registry.create_job_cluster("v", "j", {"0": 1}),
            VcStatusCode.InvalidArgument,
            "The job cluster v##j already exists.",
        )

    def test_r11_shortfall_recommends(self, h: Harness) -> None:
        """R11 (Q2 not copied): OutOfResource with the exact message and a recommendation."""
        h.create("v", {"0": 2})
        err = fails(
            lambda: h.registry.create_job_cluster("v", "j", {"0": 3}),
            VcStatusCode.OutOfResource,
            "No enough node instances to create the job cluster v##j",
        )
        assert err.replica_sets_to_recommend == {"0": 2}

    def test_job_cluster_takes_alive_parent_nodes_and_is_published(self, h: Harness) -> None:
        """J3: the job cluster is Put and published; the parent is Put, not published."""
        h.create("v", {"0": 2})
        dead = sorted(h.registry.get("v").members)[0]
        h.kill(dead)
        with pytest.raises(VcError):
            h.registry.create_job_cluster("v", "j", {"0": 2})
        result = h.run(h.registry.create_job_cluster("v", "j", {"0": 1}))
        assert set(result.plan.puts) == {"v", "v##j"}
        assert [m.id for m in result.plan.publishes] == ["v##j"]
        assert dead not in h.registry.get("v##j").members


class TestGetVirtualClustersVisitor:
    def test_r16_primary_gives_nothing_by_default(self, h: Harness) -> None:
        """R16."""
        h.job(P, "j", {"0": 1})
        assert h.registry.get_virtual_clusters(P) == []
        assert [d.id for d in h.registry.get_virtual_clusters(P, True)] == [f"{P}##j"]

    def test_r17_job_id_gives_nothing(self, h: Harness) -> None:
        """R17."""
        jc = h.job(P, "j", {"0": 1})
        assert h.registry.get_virtual_clusters(jc, True, False) == []

    def test_empty_id_lists_logical_then_primary_jobs(self, h: Harness) -> None:
        """§4.3: '' visits every logical cluster then the primary (never emitted)."""
        h.create("a", {"0": 1})
        h.create("b", {"0": 1}, divisible=False)
        h.job(P, "j", {"0": 1})
        h.job("a", "k", {"0": 1})
        assert [d.id for d in h.registry.get_virtual_clusters("", False, False)] == ["a", "b"]
        assert [d.id for d in h.registry.get_virtual_clusters("", True, True)] == [
            "a##k",
            "b",
            f"{P}##j",
        ]

    def test_r18_all_views_include_primary_and_hide_dead(self, h: Harness) -> None:
        """R18: the primary is listed; dead nodes are left out; total counts all."""
        h.create("a", {"0": 2}, divisible=False)
        dead = sorted(h.registry.get("a").members)[0]
        h.kill(dead)
        views, total = h.registry.all_views(None, lambda n: ({"CPU": 1.0}, {"CPU": 0.5}))
        assert [v.id for v in views] == ["a", P]
        assert total == 2
        assert dead not in views[0].node_instance_views
        assert views[0].node_instance_views[sorted(h.alive("a"))[0]].resources_total == {"CPU": 1.0}
        limited, total = h.registry.all_views(1, lambda n: ({}, {}))
        assert (len(limited), total) == (1, 2)


class TestAutoscalingConfig:
    def test_r19_max_below_min(self, h: Harness) -> None:
        """R19."""
        fails(
            lambda: h.registry.update_autoscaling_config("v", {"a": 2}, {"a": 1}, 10),
            VcStatusCode.InvalidArgument,
            "Invalid request, a's max and min configs do not match.",
        )

    def test_r20_max_nodes_too_small(self, h: Harness) -> None:
        """R20."""
        fails(
            lambda: h.registry.update_autoscaling_config("v", {"a": 2}, {"a": 3}, 1),
            VcStatusCode.InvalidArgument,
            "Invalid request, max_nodes is too small.",
        )

    def test_primary_and_unknown(self, h: Harness) -> None:
        """Primary is refused; an unknown cluster is NotFound."""
        fails(
            lambda: h.registry.update_autoscaling_config(P, {}, {}, 0),
            VcStatusCode.InvalidArgument,
            "Invalid request, kPrimaryClusterID's autoscaling config can not be updated by "
            "this API.",
        )
        fails(
            lambda: h.registry.update_autoscaling_config("v", {}, {}, 0),
            VcStatusCode.NotFound,
            "Virtual cluster v does not exist.",
        )

    def test_r21_stored_wholesale_without_revision_change(self, h: Harness) -> None:
        """R21: echoed by get; revision unchanged; persisted (and published if indivisible)."""
        rev = h.create("v", {"0": 1}, divisible=False).revision
        plan = h.run(h.registry.update_autoscaling_config("v", {"0": 1}, {"0": 3}, 4))
        cfg = h.registry.get_autoscaling_config("v")
        assert (dict(cfg.min_replica_sets), dict(cfg.max_replica_sets), cfg.max_nodes) == (
            {"0": 1},
            {"0": 3},
            4,
        )
        assert cfg.revision == rev
        assert plan.puts["v"].max_nodes == 4
        assert [m.id for m in plan.publishes] == ["v"]

    def test_r22_get_unknown(self, h: Harness) -> None:
        """R22: InvalidArgument for an unknown cluster; empty id too."""
        fails(
            lambda: h.registry.get_autoscaling_config("v"),
            VcStatusCode.InvalidArgument,
            "Invalid request, the virtual cluster id does not exist.",
        )
        fails(
            lambda: h.registry.get_autoscaling_config(""),
            VcStatusCode.InvalidArgument,
            "Invalid request, the virtual cluster id is empty.",
        )


class TestRemoveNodesRules:
    def test_r23_primary(self, h: Harness) -> None:
        """R23."""
        fails(
            lambda: h.registry.remove_nodes(P, []),
            VcStatusCode.InvalidArgument,
            "Invalid request, kPrimaryClusterID should not be updated via this API.",
        )

    def test_q3_unknown_or_job_cluster_is_not_found(self, h: Harness) -> None:
        """Q3 not copied: NotFound instead of a crash."""
        jc = h.job(P, "j", {"0": 1})
        for target in ("nope", jc):
            with pytest.raises(VcError) as info:
                h.registry.remove_nodes(target, [])
            assert info.value.code == VcStatusCode.NotFound

    def test_r24_new_revision_and_nodes_back_in_the_primary(self, h: Harness) -> None:
        """R24, except the revision: the target gets a new one (ant-ray keeps it, so an
        update at the old revision was accepted after nodes left); nodes are undivided in P;
        published."""
        rev = h.create("v", {"0": 2}, divisible=False).revision
        node = sorted(h.registry.get("v").members)[0]
        plan = h.run(h.registry.remove_nodes("v", [node]))
        assert h.registry.get("v").revision > rev
        assert h.registry.primary.members[node] == "NIL"
        assert [m.id for m in plan.publishes] == ["v"]

    def test_busy_or_lent_nodes_fail_all_or_nothing(self, h: Harness) -> None:
        """A busy node and a node lent to a job cluster fail; nothing is removed."""
        h.create("v", {"0": 3})
        jc = h.job("v", "j", {"0": 1})
        (lent,) = h.registry.get(jc).members
        free = [n for n in h.registry.get("v").undivided()]
        err = fails(
            lambda: h.registry.remove_nodes("v", [*free, lent], StaticUsage({free[0]})),
            VcStatusCode.UnsafeToRemove,
            "Failed to remove some of the nodes because they are not idle nor found in the "
            "virtual cluster. These nodes with failure are shown below.",
        )
        assert err.nodes_with_failure == [free[0], lent]
        assert h.counts("v") == {"0": 3}

    def test_empty_request_succeeds_and_flushes(self, h: Harness) -> None:
        """§4.5: an empty list succeeds and still flushes."""
        h.create("v", {"0": 1})
        assert set(h.registry.remove_nodes("v", []).puts) == {"v"}


class TestJobLifecycle:
    def test_r25_add_job_needs_an_indivisible_cluster(self, h: Harness) -> None:
        """R25: divisible or unknown cluster ids are refused for AddJob."""
        h.create("d", {"0": 1})
        h.create("i", {"0": 1}, divisible=False)
        for bad in ("d", "nope", P):
            fails(
                lambda bad=bad: h.registry.check_job_virtual_cluster(bad),
                VcStatusCode.InvalidArgument,
                f"Invalid virtual cluster, virtual cluster id: {bad}",
            )
        h.registry.check_job_virtual_cluster("i")
        h.registry.check_job_virtual_cluster("")

    def test_r26_idle_job_cluster_goes_when_the_job_ends(self, h: Harness) -> None:
        """R26: Delete + publish is_removed."""
        h.create("v", {"0": 2})
        jc = h.job("v", "j", {"0": 2})
        plan = h.run(h.registry.on_job_finished(jc))
        assert jc in plan.deletes
        assert [(m.id, m.is_removed) for m in plan.publishes] == [(jc, True)]
        assert h.counts("v", "NIL") == {"0": 2}

    def test_r27_detached_actor_keeps_it_until_destroyed(self, h: Harness) -> None:
        """R27/J9-J13: lazy destruction; removed as soon as the workload is gone."""
        h.create("v", {"0": 2})
        jc = h.job("v", "j", {"0": 2})
        busy = StaticUsage(busy_clusters={jc})
        plan = h.run(h.registry.on_job_finished(jc, busy))
        assert not plan.deletes and h.registry.get(jc).job_dead
        with pytest.raises(VcError, match="No enough node instances"):
            h.registry.create_job_cluster("v", "k", {"0": 2})
        assert h.run(h.registry.on_workload_gone(jc, busy)).deletes == frozenset()
        assert h.run(h.registry.on_workload_gone(jc)).deletes == {jc}
        h.job("v", "k", {"0": 2})

    def test_r28_gc_removes_dead_idle_job_clusters(self, h: Harness) -> None:
        """R28: a GC round removes job_dead && !InUse job clusters, keeps the rest."""
        a = h.job(P, "a", {"0": 1})
        b = h.job(P, "b", {"0": 1})
        c = h.job(P, "c", {"0": 1})
        busy = StaticUsage(busy_clusters={a, b})
        h.run(h.registry.on_job_finished(a, busy))
        h.run(h.registry.on_job_finished(b, busy))
        plan = h.run(h.registry.collect_expired_job_clusters(StaticUsage(busy_clusters={b})))
        assert plan.deletes == {a}
        assert h.registry.get(b) is not None and h.registry.get(c) is not None


class TestStatusProto:
    def test_status_carries_code_and_bare_message(self) -> None:
        """GcsStatus has the numeric code and the bare message."""
        assert status_proto().code == 0
        err = VcError("x")
        assert (status_proto(err).code, status_proto(err).message) == (4, "x")
