"""The unavailable-capacity cache: a node type the cloud refused is held back, with backoff,
and demand falls back to the next type that fits (issue 20: 4,067 failed gpu1 launches in a
simulated day)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gcs.autoscaler.config import ConfigError, load_cluster_config, parse_cluster_config
from gcs.autoscaler.instances.model import Instance
from gcs.autoscaler.providers.base import LaunchErrorKind, LaunchNodeError
from gcs.autoscaler.reconciler.events import EventLog
from gcs.autoscaler.reconciler.explanations import CapacityWatch
from gcs.autoscaler.simulator import load_workload, simulate, summary
from gcs.base.clock import FakeClock
from gcs.policy.autoscaling.capacity import CapacityBackoff, UnavailableCapacity
from gcs.policy.autoscaling.scheduler import InstanceStatus, schedule
from tests.autoscaler.builders import cpu, inp, ntype

ROOT = Path(__file__).resolve().parents[2]


def refused(
    node_type: str = "gpu1", kind: LaunchErrorKind = LaunchErrorKind.CAPACITY
) -> LaunchNodeError:
    return LaunchNodeError(node_type, 1, "r-1", 0, "no gpu1 left", kind)


class TestUnavailableCapacity:
    def test_a_refusal_holds_the_type_back_and_backs_off(self) -> None:
        """60 s after the first refusal, then 120, 240 ... up to the max, for refusals in a
        row; the type is offered again once each hold is over."""
        cache = UnavailableCapacity(CapacityBackoff(initial_s=60, max_s=200))
        held = cache.record_failure(refused(), 0.0)
        assert held is not None and held.until_s == 60 and held.refusals == 1
        assert "gpu1" in cache.unavailable(59.0) and cache.unavailable(60.0) == {}
        assert cache.record_failure(refused(), 61.0).until_s == 61 + 120  # type: ignore[union-attr]
        assert cache.record_failure(refused(), 182.0).until_s == 182 + 200  # type: ignore[union-attr]
        assert cache.next_change_s(182.0) == 382.0

    def test_a_refusal_during_the_hold_is_the_same_outage(self) -> None:
        """A launch requested before the hold, refused late, does not double the hold."""
        cache = UnavailableCapacity()
        first = cache.record_failure(refused(), 0.0)
        assert cache.record_failure(refused(), 10.0) is first

    def test_other_errors_are_retried_as_before(self) -> None:
        """Only capacity and quota refusals hold a type back (Karpenter caches only those)."""
        cache = UnavailableCapacity()
        assert cache.record_failure(refused(kind=LaunchErrorKind.ERROR), 0.0) is None
        assert cache.record_failure(refused("cpu4", LaunchErrorKind.QUOTA), 0.0) is not None
        assert list(cache.unavailable(1.0)) == ["cpu4"]

    def test_an_allocation_after_the_hold_ends_the_streak(self) -> None:
        """During the hold an allocation is a late answer to an older launch; after it, the
        probe worked: the next refusal starts again at the first hold."""
        cache = UnavailableCapacity(CapacityBackoff(initial_s=60, max_s=600))
        cache.record_failure(refused(), 0.0)
        assert cache.record_allocated("gpu1", 30.0) is None
        assert cache.record_allocated("gpu1", 61.0) is not None
        assert cache.record_failure(refused(), 62.0).refusals == 1  # type: ignore[union-attr]

    def test_the_reason_stays_the_same_for_the_whole_hold(self) -> None:
        """What the scheduler is told does not tick down (it would be news every round)."""
        cache = UnavailableCapacity()
        cache.record_failure(refused(), 0.0)
        assert cache.unavailable(1.0) == cache.unavailable(50.0)
        assert cache.unavailable(1.0)["gpu1"] == (
            "the cloud has no capacity for it: no gpu1 left; held back 60 s after the 1st "
            "refusal in a row"
        )


class TestCapacityWatch:
    def test_failures_are_events_that_say_what_why_and_what_next(self) -> None:
        clock = FakeClock(start_s=0.0)
        events = EventLog(clock)
        watch = CapacityWatch(UnavailableCapacity(), events)
        watch.observe([refused(), refused("cpu4", LaunchErrorKind.ERROR)], [], 0.0)
        watch.observe([], [], 61.0)
        lines = [e.message for e in events.recent()]
        assert lines == [
            "Launch of 1 x gpu1 failed: the cloud has no capacity for it (no gpu1 left); gpu1 "
            "is held back 60 s (1st refusal in a row) and pending demand goes to other node "
            "types that fit",
            "Launch of 1 x cpu4 failed: no gpu1 left; it is retried",
            "gpu1 hold is over: the next launch may try it again",
        ]

    def test_queued_launches_of_a_held_back_type_are_cancelled(self) -> None:
        """So the scheduler can pick another type instead of counting on them."""
        watch = CapacityWatch(UnavailableCapacity(), EventLog(FakeClock()))
        watch.observe([refused()], [], 0.0)
        queued = {
            "q1": Instance("q1", InstanceStatus.QUEUED, "gpu1"),
            "q2": Instance("q2", InstanceStatus.QUEUED, "cpu4"),
        }
        (update,) = watch.cancel_queued(queued, 1.0)
        assert update.instance_id == "q1" and update.new_status is InstanceStatus.TERMINATED


class TestFallback:
    def test_demand_goes_to_the_next_type_that_fits(self) -> None:
        """'a' is preferred; held back, 'b' takes the demand; the reason says why."""
        types = [ntype("a", cpu=4, priority=5), ntype("b", cpu=4)]
        base = inp(types, [], [cpu(1)])
        assert schedule(base).launches == {"a": 1}
        held = replace(base, unavailable_types={"a": "the cloud has no capacity for it"})
        reply = schedule(held)
        assert reply.launches == {"b": 1}
        assert any(
            d.reason == "not launching a: it is unavailable (the cloud has no capacity for it)"
            for d in reply.reasons
        )

    def test_with_nothing_else_that_fits_the_demand_waits_and_says_why(self) -> None:
        types = [ntype("a", cpu=4)]
        reply = schedule(replace(inp(types, [], [cpu(2)]), unavailable_types={"a": "quota"}))
        assert reply.launches == {}
        # not infeasible: the type fits, the cloud holds it back for a while
        (why,) = [d.reason for d in reply.reasons if d.action == "pending-capacity"]
        assert why == "2 pending {CPU:1} requests cannot be placed now: a is unavailable (quota)"
        assert [w.reason.value for w in reply.waiting] == ["pending-capacity"]


class TestConfig:
    def test_capacity_backoff_is_read_from_the_cluster_yaml(self) -> None:
        raw = {"available_node_types": {"h": {}}, "capacity_backoff": {"initial_s": 5, "max_s": 50}}
        assert parse_cluster_config(raw).capacity_backoff == CapacityBackoff(5, 50, 2)
        with pytest.raises(ConfigError, match="capacity_backoff: max_s 1 < initial_s 5"):
            parse_cluster_config({**raw, "capacity_backoff": {"initial_s": 5, "max_s": 1}})


class TestSimulatedDay:
    @pytest.mark.timeout(900)
    async def test_failed_launches_drop_tenfold_and_capacity_comes_no_later(self) -> None:
        """examples/cluster.yaml + the first 6 h of examples/workload.yaml (the cloud has 3
        gpu1, the config allows 4): without the cache the autoscaler relaunched gpu1 every
        round; with it, at least 10x fewer failed launches, the same time to capacity."""
        cluster = load_cluster_config(ROOT / "examples" / "cluster.yaml")
        workload = replace(load_workload(ROOT / "examples" / "workload.yaml"), duration_s=6 * 3600)
        off = replace(cluster, capacity_backoff=CapacityBackoff(initial_s=0, max_s=0))
        before = summary(await simulate(off, workload))
        after = summary(await simulate(cluster, workload))
        assert before["failed_launches"] >= 10 * after["failed_launches"] > 0, (before, after)
        for key in ("p50", "max"):
            assert after["time_to_capacity_s"][key] <= before["time_to_capacity_s"][key]
        assert after["tasks"] == before["tasks"]
