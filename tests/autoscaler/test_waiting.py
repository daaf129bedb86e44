"""Why demand waits: the pure verdict (:mod:`gcs.policy.autoscaling.scheduler.waiting`), the
scheduler
that attaches it to its reply, and the virtual-cluster plan that books it to a cluster."""

from __future__ import annotations

import json

import pytest

from gcs.autoscaler.reconciler import vc_scaling
from gcs.autoscaler.reconciler.observed import ray_nodes_from_state
from gcs.policy.autoscaling.scheduler import schedule
from gcs.policy.autoscaling.scheduler.types import (
    GangRequest,
    InstanceStatus,
    LabelConstraint,
    LabelOp,
    NodeInstance,
    NodeTypeConfig,
    ResourceDemand,
    SchedulerConfig,
    SchedulingInput,
)
from gcs.policy.autoscaling.scheduler.waiting import (
    WaitingDemand,
    WaitKind,
    WaitReason,
    counts,
    from_json,
    gang_verdict,
    to_json,
    unplaced_verdict,
    verdict_for,
)
from tests.autoscaler.test_reconciler import CLUSTER, with_running_head
from tests.autoscaler.test_vc_scaling import clusters, vc_demand, worker

CPU2 = NodeTypeConfig("cpu2", {"CPU": 2.0}, max_workers=1)
GPU1 = NodeTypeConfig("gpu1", {"CPU": 1.0, "GPU": 1.0}, max_workers=1, labels={"acc": "a100"})
TYPES = {"cpu2": CPU2, "gpu1": GPU1}


def _inp(*demands: ResourceDemand, **kw: object) -> SchedulingInput:
    return SchedulingInput(
        config=SchedulerConfig(node_types=TYPES, max_num_nodes=kw.pop("max_num_nodes", None)),  # type: ignore[arg-type]
        demands=demands,
        **kw,  # type: ignore[arg-type]
    )


def _rows(items: tuple[WaitingDemand, ...]) -> list[tuple[str, dict[str, float], int]]:
    return sorted((w.reason.value, dict(w.resources), w.count) for w in items)


class TestUnplacedVerdict:
    def test_no_type_has_the_resource_is_infeasible(self) -> None:
        verdict, why = unplaced_verdict(ResourceDemand({"CPUS": 1.0}), 1, TYPES, {}, {}, None)
        assert verdict is WaitReason.INFEASIBLE
        assert why == (
            "1 pending {CPUS:1} requests fit no node type: no node type has CPUS; change the "
            "request or add a type"
        )

    def test_a_type_at_max_workers_is_capped_not_infeasible(self) -> None:
        """The demo's `{CPU: 1, GPU: 1}` with gpu1 only at its max_workers."""
        d = ResourceDemand({"CPU": 1.0, "GPU": 1.0})
        limited = {"gpu1": "is at max_workers 1"}
        verdict, why = unplaced_verdict(d, 2, TYPES, limited, {}, None)
        assert verdict is WaitReason.CAPPED
        assert (
            why
            == "2 pending {CPU:1, GPU:1} requests cannot be placed now: gpu1 is at max_workers 1"
        )

    def test_the_cluster_cap_is_capped(self) -> None:
        d = ResourceDemand({"CPU": 2.0})
        full = "is at max_workers 3 (plus the head)"
        assert unplaced_verdict(d, 1, TYPES, {}, {}, full)[0] is WaitReason.CAPPED

    def test_a_type_the_cloud_holds_back_waits_for_capacity(self) -> None:
        d = ResourceDemand({"GPU": 1.0})
        unavailable = {"gpu1": "is unavailable (quota)"}
        assert unplaced_verdict(d, 1, TYPES, {}, unavailable, None)[0] is (
            WaitReason.PENDING_CAPACITY
        )

    def test_a_limit_on_a_type_that_does_not_fit_does_not_make_it_capped(self) -> None:
        """cpu2 at its max says nothing about a GPU request."""
        d = ResourceDemand({"TPU": 1.0})
        verdict, _ = unplaced_verdict(d, 1, TYPES, {"cpu2": "is at max_workers 1"}, {}, None)
        assert verdict is WaitReason.INFEASIBLE

    def test_label_selectors_no_fitting_type_matches_are_infeasible(self) -> None:
        selector = (LabelConstraint("acc", LabelOp.IN, ("h100",)),)
        d = ResourceDemand({"GPU": 1.0}, selectors=(selector,))
        verdict, why = unplaced_verdict(d, 1, TYPES, {"gpu1": "is at max_workers 1"}, {}, None)
        assert verdict is WaitReason.INFEASIBLE
        assert "matches their label selectors" in why
        a100 = (LabelConstraint("acc", LabelOp.IN, ("a100",)),)
        ok = ResourceDemand({"GPU": 1.0}, selectors=(selector, a100))
        assert unplaced_verdict(ok, 1, TYPES, {"gpu1": "x"}, {}, None)[0] is WaitReason.CAPPED


class TestGangVerdict:
    def test_what_does_not_place_even_without_limits_is_infeasible(self) -> None:
        shapes = [ResourceDemand({"CPU": 2.0}), ResourceDemand({"CPU": 8.0})]
        verdict, why = gang_verdict(shapes, False, {"cpu2": "is at max_workers 1"}, {}, None)
        assert verdict is WaitReason.INFEASIBLE and "({CPU:2}, {CPU:8})" in why

    def test_what_places_without_limits_is_capped(self) -> None:
        shapes = [ResourceDemand({"CPU": 2.0}, 2)]
        verdict, why = gang_verdict(shapes, True, {"cpu2": "is at max_workers 1"}, {}, None)
        assert (verdict, why) == (
            WaitReason.CAPPED,
            "cannot be placed whole now: cpu2 is at max_workers 1",
        )
        verdict, why = gang_verdict(shapes, True, {}, {}, None)
        assert verdict is WaitReason.CAPPED and "more nodes than" in why
        verdict, _ = gang_verdict(shapes, True, {}, {"cpu2": "is unavailable (quota)"}, None)
        assert verdict is WaitReason.PENDING_CAPACITY


class TestSchedulerReply:
    def test_capped_demand_keeps_ray_s_infeasible_list_but_not_the_verdict(self) -> None:
        """3 x {CPU: 2} with one cpu2 allowed: one waits for the cpu2 being added, two are
        capped; Ray's list on the wire still counts the two (a limit is infeasible there)."""
        reply = schedule(_inp(ResourceDemand({"CPU": 2.0}, 3)))
        assert reply.launches == {"cpu2": 1}
        assert [(d.resources, d.count) for d in reply.infeasible_demands] == [({"CPU": 2.0}, 2)]
        assert _rows(reply.waiting) == [
            ("capped", {"CPU": 2.0}, 2),
            ("pending-capacity", {"CPU": 2.0}, 1),
        ]
        (capped,) = [d for d in reply.reasons if d.action == "capped"]
        assert capped.reason == (
            "2 pending {CPU:2} requests cannot be placed now: cpu2 is at max_workers 1"
        )
        assert not [d for d in reply.reasons if d.action == "infeasible"]

    def test_demand_on_an_instance_still_starting_waits_for_it(self) -> None:
        starting = NodeInstance("i-1", "cpu2", status=InstanceStatus.ALLOCATED)
        reply = schedule(_inp(ResourceDemand({"CPU": 2.0}, 1), instances=(starting,)))
        assert reply.launches == {}
        (w,) = reply.waiting
        assert (w.reason, w.count, w.why) == (
            WaitReason.PENDING_CAPACITY,
            1,
            "1 pending {CPU:2} requests wait for 1 x cpu2 being added",
        )

    def test_infeasible_and_capped_side_by_side(self) -> None:
        reply = schedule(
            _inp(ResourceDemand({"CPUS": 1.0}), ResourceDemand({"GPU": 1.0}, 2), max_num_nodes=5)
        )
        assert _rows(reply.waiting) == [
            ("capped", {"GPU": 1.0}, 1),
            ("infeasible", {"CPUS": 1.0}, 1),
            ("pending-capacity", {"GPU": 1.0}, 1),
        ]

    def test_an_unplaceable_gang_gets_one_verdict(self) -> None:
        """A bundle no type holds is infeasible; a STRICT_SPREAD of two cpu2 bundles with
        one cpu2 allowed is capped (the packer places it once the limits are lifted)."""
        big = GangRequest((ResourceDemand({"CPU": 8.0}),), details="pg-big")
        two = GangRequest((ResourceDemand({"CPU": 2.0}, 2, anti_affinity=("pg", "x")),), "pg-2")
        reply = schedule(SchedulingInput(SchedulerConfig(TYPES), gangs=(big, two)))
        verdicts = {w.details: w.reason for w in reply.waiting}
        assert verdicts == {"pg-big": WaitReason.INFEASIBLE, "pg-2": WaitReason.CAPPED}
        assert all(w.kind is WaitKind.PLACEMENT_GROUP for w in reply.waiting)


class TestDocument:
    def test_round_trip(self) -> None:
        selector = (LabelConstraint("zone", LabelOp.NOT_IN, ("b",)),)
        items = (
            WaitingDemand(WaitKind.TASKS, {"CPU": 2.0}, 2, WaitReason.CAPPED, "why", "team-a"),
            WaitingDemand(
                WaitKind.PLACEMENT_GROUP, {"GPU": 1.0}, 1, WaitReason.INFEASIBLE, "w", "", "pg",
                selectors=(selector,),
            ),
        )  # fmt: skip
        assert from_json(to_json(items, at_s=3.0)) == items
        assert json.loads(to_json(items, at_s=3.0))["t"] == 3.0

    @pytest.mark.parametrize("raw", [b"[]", b"{}", b'{"waiting": [{"kind": "nope"}]}', b"x"])
    def test_anything_else_is_a_value_error(self, raw: bytes) -> None:
        with pytest.raises(ValueError):
            from_json(raw)

    def test_counts_by_reason_and_cluster(self) -> None:
        items = (
            WaitingDemand(WaitKind.TASKS, {"CPU": 2.0}, 2, WaitReason.CAPPED, "", "team-a"),
            WaitingDemand(WaitKind.TASKS, {"GPU": 1.0}, 3, WaitReason.CAPPED, ""),
            WaitingDemand(WaitKind.TASKS, {"CPU": 1.0}, 1, WaitReason.CAPPED, ""),
        )
        assert counts(items) == {("capped", "team-a"): 2, ("capped", ""): 4}


class TestVerdictFor:
    def entry(self, reason: WaitReason, cluster: str = "") -> WaitingDemand:
        return WaitingDemand(WaitKind.TASKS, {"CPU": 2.0}, 1, reason, "", cluster)

    def test_infeasible_only_when_every_entry_for_the_shape_says_so(self) -> None:
        inf, cap = self.entry(WaitReason.INFEASIBLE), self.entry(WaitReason.CAPPED)
        assert verdict_for((inf,), {"CPU": 2.0, "GPU": 0.0}) is WaitReason.INFEASIBLE
        assert verdict_for((inf, cap), {"CPU": 2.0}) is WaitReason.CAPPED
        assert verdict_for((inf,), {"CPU": 1.0}) is None

    def test_a_virtual_cluster_s_verdict_is_its_own(self) -> None:
        tenant = self.entry(WaitReason.INFEASIBLE, "team-a")
        assert verdict_for((tenant,), {"CPU": 2.0}) is None
        assert verdict_for((tenant,), {"CPU": 2.0}, "team-a") is WaitReason.INFEASIBLE


class TestVirtualClusterPlan:
    def test_a_cluster_s_capped_demand_is_booked_to_it(self) -> None:
        """vc1 holds busy b0 and may have one node: its 4 CPUs more are capped in vc1."""
        h = with_running_head()
        worker(h, "b0", "cb0", busy=True)
        clusters(h, ["b0"], [], min={"type-1": 0}, max={"type-1": 1}, max_nodes=1)
        vc_demand(h, 4, 2)
        state = h.gcs.state
        nodes = ray_nodes_from_state(state)
        plan = vc_scaling.plan_virtual_clusters(state, {}, nodes, CLUSTER, 0.0, schedule)
        assert [(w.reason, w.count, w.cluster_id) for w in plan.waiting] == [
            (WaitReason.CAPPED, 2, "vc1")
        ]


class TestEvents:
    def test_capped_and_infeasible_are_told_apart_once_each(self) -> None:
        """The event line said "cannot be placed now: cpu2 is at max_workers 1" under a
        status that called the same demand infeasible; now the event's kind is the verdict
        too, and a verdict is told once until it changes."""
        from gcs.autoscaler.reconciler.events import EventLog
        from gcs.autoscaler.reconciler.explanations import DecisionNotes
        from gcs.base.clock import FakeClock

        log = EventLog(FakeClock(0.0))
        notes = DecisionNotes(log)
        reply = schedule(_inp(ResourceDemand({"CPU": 2.0}, 3), ResourceDemand({"CPUS": 1.0})))
        notes.note(reply.reasons)
        notes.note(
            schedule(_inp(ResourceDemand({"CPU": 2.0}, 4), ResourceDemand({"CPUS": 1.0}))).reasons
        )
        assert [(e.kind, e.message) for e in log.recent()] == [
            ("capped", "2 pending {CPU:2} requests cannot be placed now: cpu2 is at max_workers 1"),
            (
                "infeasible",
                "1 pending {CPUS:1} requests fit no node type: no node type has CPUS; change "
                "the request or add a type",
            ),
        ]
