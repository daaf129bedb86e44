"""Scheduler behaviours: Ray's bugs done right, and the beyond-Ray options."""

from __future__ import annotations

from dataclasses import replace

from gcs.policy.autoscaling.model import InstanceStatus
from gcs.policy.autoscaling.scheduler import (
    GangRequest,
    LaunchFailure,
    NodeInstance,
    Options,
    ResourceDemand,
    TerminationCause,
    schedule,
)
from tests.autoscaler.builders import cpu, inp, ntype, running


class TestRayQuirksFixed:
    """Where Ray 2.60 has a bug we do the right thing."""

    def test_min_worker_nodes_are_distinct_not_aliases(self) -> None:
        """min a=2, b=1, cluster cap 2: Ray drops both a's (aliased); we drop only one."""
        reply = schedule(inp([ntype("a", mn=2), ntype("b", mn=1)], max_num_nodes=2))
        assert sum(reply.launches.values()) == 2
        assert (
            reply.terminations == ()
        )  # nothing to terminate: unlaunched nodes just aren't launched
        assert any(d.action == "skip" for d in reply.reasons)

    def test_node_marked_for_termination_does_not_absorb_demand(self) -> None:
        """An outdated node leaves; the demand it would have taken gets a new node."""
        t = ntype("t", launch_config_hash="h1")
        old = replace(running("old", "t"), launch_config_hash="h0")
        reply = schedule(inp([t], [old], [cpu(1)]))
        assert [x.cause for x in reply.terminations] == [TerminationCause.OUTDATED]
        assert reply.launches == {"t": 1}

    def test_running_node_of_unknown_type_does_not_crash(self) -> None:
        """Ray raises KeyError with the launch-config check off; we keep the node, no cap."""
        reply = schedule(
            inp([ntype("cpu")], [running("x", "gone")], [cpu(2)], disable_launch_config_check=True)
        )
        assert reply.terminations == ()
        assert reply.launches == {}  # the unknown-type node still runs and absorbs demand

    def test_head_of_unknown_type_is_never_terminated(self) -> None:
        """An outdated head is kept with a reason."""
        reply = schedule(inp([ntype("cpu")], [running("h", "oldhead", head=True)]))
        assert reply.terminations == ()
        assert any("never terminated" in d.reason for d in reply.reasons)

    def test_idle_termination_counts_nodes_already_stopping_against_min_workers(self) -> None:
        """Last round's drains (RAY_STOP_REQUESTED, not yet reported as draining) are
        leaving: Ray counts them as staying and idle-terminates the min_workers node too."""
        stopping = [
            replace(running(f"s{i}", idle_s=0), status=InstanceStatus.RAY_STOP_REQUESTED)
            for i in range(7)
        ]
        last = running("last", idle_s=900)
        reply = schedule(inp([ntype("cpu", mn=1)], [*stopping, last], idle_timeout_s=300))
        assert reply.terminations == () and reply.launches == {}
        assert any("min_workers of cpu is 1" in d.reason for d in reply.reasons)
        # with 3 idle and min 2, one goes (the 7 leaving do not make room for more)
        more = [running(f"n{i}", idle_s=900 + i) for i in range(3)]
        reply = schedule(inp([ntype("cpu", mn=2)], [*stopping, *more], idle_timeout_s=300))
        assert [t.instance_id for t in reply.terminations] == ["n2"]


def stopping(iid: str, t: str = "cpu") -> NodeInstance:
    """A node an earlier round chose for termination, its drain not yet reported."""
    return replace(running(iid, t), status=InstanceStatus.RAY_STOP_REQUESTED)


class TestMaxWithNodesAlreadyLeaving:
    """Nodes already stopping are leaving: the surplus over a max is over the nodes that stay.
    Counting them as present (our nodes keep their Ray node id, so unlike Ray's they sort
    last and are never chosen again) terminated as many running nodes more."""

    def test_max_workers_surplus_excludes_nodes_already_stopping(self) -> None:
        """10 running + 2 stopping, max_workers 10: nothing more goes (was: 2, leaving 8)."""
        nodes = [running(f"n{i}", idle_s=i) for i in range(10)]
        leaving = [stopping("s0"), stopping("s1")]
        reply = schedule(inp([ntype("cpu", mx=10)], [*nodes, *leaving]))
        assert reply.terminations == () and reply.launches == {}
        # 12 running + 2 stopping: the 2 longest idle running go, not 4
        more = [*nodes, running("n10", idle_s=10), running("n11", idle_s=11)]
        reply = schedule(inp([ntype("cpu", mx=10)], [*more, *leaving]))
        assert [t.instance_id for t in reply.terminations] == ["n11", "n10"]
        assert {t.cause for t in reply.terminations} == {TerminationCause.MAX_NUM_NODE_PER_TYPE}
        assert "12 nodes of cpu > max_workers 10 (and 2 already stopping)" in (
            reply.terminations[0].reason
        )

    def test_max_num_nodes_surplus_excludes_nodes_already_stopping(self) -> None:
        """Head + 9 running + 2 stopping, max_num_nodes 10: nothing more goes (was: 2)."""
        head = running("h", "head", head=True)
        nodes = [running(f"n{i}", idle_s=i) for i in range(9)]
        leaving = [stopping("s0"), stopping("s1")]
        types = [ntype("head", cpu=0, mx=1), ntype("cpu", mx=20)]
        reply = schedule(inp(types, [head, *nodes, *leaving], max_num_nodes=10))
        assert reply.terminations == () and reply.launches == {}
        more = [*nodes, running("n9", idle_s=9), running("n10", idle_s=10)]
        reply = schedule(inp(types, [head, *more, *leaving], max_num_nodes=10))
        assert [t.instance_id for t in reply.terminations] == ["n10", "n9"]
        assert {t.cause for t in reply.terminations} == {TerminationCause.MAX_NUM_NODES}
        assert "(and 2 already stopping)" in reply.terminations[0].reason


class TestIdleTermination:
    """Ray's idle rules."""

    def test_idle_must_be_strictly_longer_than_timeout(self) -> None:
        """idle == timeout stays; idle > timeout goes."""
        nodes = [running("a", idle_s=300), running("b", idle_s=300.001)]
        reply = schedule(inp([ntype("cpu")], nodes, idle_timeout_s=300))
        assert [t.instance_id for t in reply.terminations] == ["b"]

    def test_min_workers_keeps_the_least_idle(self) -> None:
        """Two idle nodes, min 1: the longer idle one goes."""
        nodes = [running("a", idle_s=400), running("b", idle_s=900)]
        reply = schedule(inp([ntype("cpu", mn=1)], nodes, idle_timeout_s=300))
        assert [t.instance_id for t in reply.terminations] == ["b"]

    def test_per_type_idle_timeout_wins(self) -> None:
        """A type's idle_timeout_s overrides the cluster's."""
        reply = schedule(
            inp([ntype("cpu", idle_timeout_s=10)], [running("a", idle_s=20)], idle_timeout_s=1000)
        )
        assert [t.cause for t in reply.terminations] == [TerminationCause.IDLE]


class TestBeyondRay:
    """Options that Ray 2.60 lacks; all off by default."""

    def test_disruption_budget_caps_idle_terminations(self) -> None:
        """Five idle nodes, budget 2: the two longest idle go."""
        nodes = [running(f"n{i}", idle_s=400 + i) for i in range(5)]
        opts = Options(disruption_budget_nodes=2)
        reply = schedule(inp([ntype("cpu")], nodes, options=opts, idle_timeout_s=300))
        assert sorted(t.instance_id for t in reply.terminations) == ["n3", "n4"]
        assert any("disruption budget" in d.reason for d in reply.reasons)

    def test_disruption_budget_as_percent(self) -> None:
        """25 % of 8 workers = 2 per round."""
        nodes = [running(f"n{i}", idle_s=400) for i in range(8)]
        opts = Options(disruption_budget_percent=25)
        reply = schedule(inp([ntype("cpu")], nodes, options=opts, idle_timeout_s=300))
        assert len(reply.terminations) == 2

    def test_disruption_budget_counts_nodes_already_leaving(self) -> None:
        """A budget caps the nodes leaving at once, not per round: last round's 2 drains
        (still RAY_STOP_REQUESTED) spend a budget of 2 (was: 2 more went every round)."""
        idle = [running(f"n{i}", idle_s=400 + i) for i in range(5)]
        opts = Options(disruption_budget_nodes=2)
        two = [stopping("s0"), stopping("s1")]
        reply = schedule(inp([ntype("cpu")], [*idle, *two], options=opts, idle_timeout_s=300))
        assert reply.terminations == ()
        assert any(
            "budget of 2 node(s) used (2 already leaving)" in d.reason for d in reply.reasons
        )
        one = [stopping("s0")]
        reply = schedule(inp([ntype("cpu")], [*idle, *one], options=opts, idle_timeout_s=300))
        assert [t.instance_id for t in reply.terminations] == ["n4"]

    def test_disruption_budget_percent_counts_leaving_nodes_in_base_and_spent(self) -> None:
        """25 % of 8 workers (6 idle + 2 stopping, still nodes) = 2, both spent: none go."""
        idle = [running(f"n{i}", idle_s=400) for i in range(6)]
        opts = Options(disruption_budget_percent=25)
        nodes = [*idle, stopping("s0"), stopping("s1")]
        reply = schedule(inp([ntype("cpu")], nodes, options=opts, idle_timeout_s=300))
        assert reply.terminations == ()

    def test_disruption_budget_counts_this_rounds_other_terminations(self) -> None:
        """An outdated node terminated this round (never held back) spends 1 of a budget of 2."""
        t = ntype("cpu", launch_config_hash="h1")
        idle = [
            replace(running(f"n{i}", idle_s=400 + i), launch_config_hash="h1") for i in range(4)
        ]
        old = replace(running("old"), launch_config_hash="h0")
        opts = Options(disruption_budget_nodes=2)
        reply = schedule(inp([t], [*idle, old], options=opts, idle_timeout_s=300))
        assert sorted(x.instance_id for x in reply.terminations) == ["n3", "old"]

    def test_do_not_disrupt_label_protects_idle_node(self) -> None:
        """Labelled nodes are never idle-terminated."""
        nodes = [
            running("keep", idle_s=999, labels={"gcs/do-not-disrupt": "true"}),
            running("go", idle_s=500),
        ]
        opts = Options(do_not_disrupt_label="gcs/do-not-disrupt")
        reply = schedule(inp([ntype("cpu")], nodes, options=opts, idle_timeout_s=300))
        assert [t.instance_id for t in reply.terminations] == ["go"]

    def test_unavailable_type_is_skipped_until_ttl_expires(self) -> None:
        """A failed launch of 'a' routes demand to 'b' for the TTL, then 'a' is back."""
        types = [ntype("a", cpu=4, priority=5), ntype("b", cpu=4)]
        base = inp(types, [], [cpu(1)], options=Options(unavailable_type_ttl_s=60))
        failed = replace(base, launch_failures=(LaunchFailure("a", 100.0),), now_s=130.0)
        assert schedule(failed).launches == {"b": 1}
        assert schedule(replace(failed, now_s=161.0)).launches == {"a": 1}
        assert schedule(
            replace(
                base,
                launch_failures=failed.launch_failures,
                now_s=130.0,
                config=replace(base.config, options=Options()),
            )
        ).launches == {"a": 1}

    def test_own_idle_clock_resets_only_when_work_lands(self) -> None:
        """Raylet reports 0 s idle after a no-op; our clock keeps counting from last work."""
        opts = Options(own_idle_clock=True)
        first = inp([ntype("cpu")], [running("a", idle_s=100)], options=opts, idle_timeout_s=300)
        r1 = schedule(replace(first, now_s=1000.0))
        assert r1.last_work_s == {"a": 900.0}
        # raylet's idle clock was reset by something that was not work for this node
        second = replace(
            first, instances=(running("a", idle_s=0),), now_s=1250.0, last_work_s=r1.last_work_s
        )
        r2 = schedule(second)
        assert [t.instance_id for t in r2.terminations] == ["a"]  # idle 350 s by our clock
        busy = replace(second, instances=(running("a", free=0),), now_s=1250.0)
        assert schedule(busy).last_work_s == {"a": 1250.0}

    def test_cold_start_releases_full_first_batch(self) -> None:
        """With no running worker, every launched type is marked launch-now."""
        reply = schedule(
            inp([ntype("cpu")], [], [cpu(40)], options=Options(cold_start_full_batch=True))
        )
        assert reply.launches == {"cpu": 10} and reply.launch_now_types == ("cpu",)
        warm = inp(
            [ntype("cpu")],
            [running("w", free=0)],
            [cpu(4)],
            options=Options(cold_start_full_batch=True),
        )
        assert schedule(warm).launch_now_types == ()

    def test_gang_fallback_used_only_when_enabled(self) -> None:
        """Ray 2.60 ignores fallback bundle lists; with the option we try them in order."""
        big = (ResourceDemand({"CPU": 64}),)
        small = (ResourceDemand({"CPU": 2}),)
        base = replace(inp([ntype("cpu")]), gangs=(GangRequest(big, "pg", (small,)),))
        assert len(schedule(base).infeasible_gangs) == 1
        on = replace(base, config=replace(base.config, options=Options(gang_fallbacks=True)))
        assert schedule(on).launches == {"cpu": 1}

    def test_pending_idle_clock_carries_between_rounds(self) -> None:
        """Unneeded ALLOCATED nodes are terminated once their carried clock passes the timeout."""
        pend = NodeInstance("p", "cpu", InstanceStatus.ALLOCATED)
        base = inp([ntype("cpu")], [pend], pending_idle_timeout_s=0.1)
        r1 = schedule(replace(base, now_s=10.0))
        assert r1.terminations == () and r1.pending_since_s == {"cpu": (10.0,)}
        r2 = schedule(replace(base, now_s=10.2, pending_since_s=r1.pending_since_s))
        assert [t.instance_id for t in r2.terminations] == ["p"]


class TestLabelSelectors:
    """IN / NOT_IN / EXISTS / DOES_NOT_EXIST pick the node type whose labels match."""

    def _launch(self, op: str, values: tuple[str, ...] = ()) -> dict[str, int]:
        from gcs.policy.autoscaling.scheduler import LabelConstraint, LabelOp

        types = [ntype("plain"), ntype("tpu", labels={"acc": "tpu"})]
        sel = ((LabelConstraint("acc", LabelOp(op), values),),)
        return dict(schedule(inp(types, [], [ResourceDemand({"CPU": 1}, 1, sel)])).launches)

    def test_each_operator(self) -> None:
        """Each operator selects exactly the type it should."""
        assert self._launch("in", ("tpu",)) == {"tpu": 1}
        assert self._launch("not_in", ("tpu",)) == {"plain": 1}
        assert self._launch("exists") == {"tpu": 1}
        assert self._launch("does_not_exist") == {"plain": 1}


def test_work_cap_defers_shapes_beyond_the_budget_and_says_so() -> None:
    """A round packs at most max_work_units / nodes distinct shapes; the rest waits."""
    from dataclasses import replace as _replace

    from gcs.policy.autoscaling.scheduler import schedule as _schedule
    from gcs.policy.autoscaling.scheduler.types import (
        NodeInstance,
        NodeTypeConfig,
        Options,
        ResourceDemand,
        SchedulerConfig,
        SchedulingInput,
    )

    config = SchedulerConfig(
        node_types={"cpu4": NodeTypeConfig("cpu4", {"CPU": 4}, max_workers=100)},
        options=Options(max_work_units=4),
    )
    nodes = tuple(
        NodeInstance(f"n{i}", "cpu4", total={"CPU": 4}, available={"CPU": 0}, ray_node_id=f"{i}")
        for i in range(2)
    )
    demands = tuple(ResourceDemand({"CPU": 1 + i / 10}, 1) for i in range(5))
    reply = _schedule(SchedulingInput(config=config, instances=nodes, demands=demands))
    assert sum(reply.launches.values()) >= 1
    [deferred] = [d for d in reply.reasons if d.action == "deferred"]
    assert "3 of 5 request shapes" in deferred.reason
    uncapped = _replace(config, options=Options())
    full = _schedule(SchedulingInput(config=uncapped, instances=nodes, demands=demands))
    assert not [d for d in full.reasons if d.action == "deferred"]
