"""Hypothesis properties of ``schedule`` over random clusters and demand."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gcs.policy.autoscaling.model import InstanceStatus, NodeKind
from gcs.policy.autoscaling.scheduler import (
    IpprSpec,
    IpprStatus,
    NodeInstance,
    NodeTypeConfig,
    ResourceDemand,
    SchedulerConfig,
    SchedulingInput,
    schedule,
)
from gcs.policy.autoscaling.scheduler.types import SCHEDULABLE_STATUSES
from gcs.policy.autoscaling.scheduler.waiting import WaitKind, WaitReason, fitting_types, shape_key

TYPES = {
    "head": NodeTypeConfig("head", {"CPU": 0}, 0, 1),
    "small": NodeTypeConfig("small", {"CPU": 2, "memory": 8}, 0, 6),
    "big": NodeTypeConfig("big", {"CPU": 16, "memory": 64}, 0, 3),
    "gpu": NodeTypeConfig("gpu", {"CPU": 8, "GPU": 2}, 0, 2, labels={"acc": "A100"}),
}
#: The "small" type may be resized in place up to this (when the draw enables IPPR).
SMALL_IPPR = IpprSpec(max_cpu=6, max_memory=24, min_cpu=2, min_memory=8)


@st.composite
def ippr_status(draw: st.DrawFn, cpu: float, mem: float) -> IpprStatus:
    """Any state the provider may report for a small pod (suggestions never above spec max)."""
    kind = draw(st.sampled_from(["rest", "rest", "inflight", "failed", "queued", "suggested"]))
    if kind == "inflight":
        return IpprStatus(cpu, mem, SMALL_IPPR.max_cpu, SMALL_IPPR.max_memory, resizing_at=5)
    if kind == "failed":
        return IpprStatus(cpu, mem, last_failed_at=1, last_failed_reason="Pod resize failed")
    if kind == "queued":
        return IpprStatus(cpu, mem, k8s_resize_status="new", last_failed_at=1)
    if kind == "suggested":
        return IpprStatus(cpu, mem, suggested_max_cpu=draw(st.sampled_from([2.0, 3.0, 6.0])))
    return IpprStatus(cpu, mem)


@st.composite
def inputs(draw: st.DrawFn, ippr_heavy: bool = False) -> SchedulingInput:
    """Random cluster and demand; ``ippr_heavy`` makes mostly resizable running small pods."""
    mins = {n: draw(st.integers(0, 2)) if n != "head" else 0 for n in TYPES}
    types = {
        n: NodeTypeConfig(t.name, t.resources, min(mins[n], t.max_workers), t.max_workers, t.labels)
        for n, t in TYPES.items()
    }
    nodes = [
        NodeInstance("h", "head", kind=NodeKind.HEAD, ray_node_id="hh", total={"CPU": 0},
                     available={"CPU": 0}, idle_duration_ms=draw(st.integers(0, 10**7)))
    ]  # fmt: skip
    for i in range(draw(st.integers(0, 10))):
        t = draw(
            st.sampled_from(
                ["small", "small", "small", "gpu"] if ippr_heavy else ["small", "big", "gpu"]
            )
        )
        statuses = [InstanceStatus.RAY_RUNNING, InstanceStatus.REQUESTED, InstanceStatus.ALLOCATED]
        status = draw(st.sampled_from(statuses[:1] * 4 + statuses if ippr_heavy else statuses))
        total = dict(TYPES[t].resources)
        frac = draw(st.sampled_from([0.0, 0.5, 1.0]))
        avail = {k: v * frac for k, v in total.items()}
        running = status is InstanceStatus.RAY_RUNNING
        ippr = None
        if t != "big" and draw(st.integers(0, 3)):  # gpu pods get a status but have no spec
            ippr = draw(ippr_status(total["CPU"], total.get("memory", 0.0)))
        nodes.append(
            NodeInstance(f"i{i}", t, status, ray_node_id=f"r{i}" if running else "", total=total,
                         available=avail, idle_duration_ms=draw(st.integers(0, 10**6)),
                         cloud_instance_id=f"pod{i}", ippr=ippr)
        )  # fmt: skip
    shapes = [{"CPU": 1}, {"CPU": 4, "memory": 16}, {"GPU": 1}, {"CPU": 32}, {"CPU": 0.5}]
    demands = tuple(
        ResourceDemand(draw(st.sampled_from(shapes)), draw(st.integers(1, 30)))
        for _ in range(draw(st.integers(0, 4)))
    )
    if ippr_heavy or draw(st.booleans()):
        types["small"] = replace(types["small"], ippr=SMALL_IPPR)
    cfg = SchedulerConfig(
        types, max_num_nodes=draw(st.one_of(st.none(), st.integers(1, 15))),
        idle_timeout_s=draw(st.one_of(st.none(), st.integers(0, 500))),
    )  # fmt: skip
    return SchedulingInput(cfg, tuple(nodes), demands)


def _after(inp: SchedulingInput) -> dict[str, int]:
    reply = schedule(inp)
    gone = {t.instance_id for t in reply.terminations}
    count: dict[str, int] = dict(reply.launches)
    for n in inp.instances:
        if n.status in SCHEDULABLE_STATUSES and n.instance_id not in gone:
            count[n.node_type] = count.get(n.node_type, 0) + 1
    return count


SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


class TestSchedulerProperties:
    """Invariants that hold for every input."""

    @SETTINGS
    @given(inputs())
    def test_never_over_max_per_type_or_cluster(self, inp: SchedulingInput) -> None:
        """After the decisions no type exceeds max_workers and the cluster its cap."""
        count = _after(inp)
        for t, c in count.items():
            assert c <= inp.config.node_types[t].max_workers
        if inp.config.max_num_nodes:
            assert sum(count.values()) <= max(inp.config.max_num_nodes, 1)

    @SETTINGS
    @given(inputs())
    def test_never_under_min_unless_capped(self, inp: SchedulingInput) -> None:
        """Every type reaches min_workers when no cluster cap is in the way."""
        if inp.config.max_num_nodes is not None:
            return
        count = _after(inp)
        for t, cfg in inp.config.node_types.items():
            assert count.get(t, 0) >= cfg.min_workers

    @SETTINGS
    @given(inputs())
    def test_never_terminates_head_or_busy_node(self, inp: SchedulingInput) -> None:
        """Head never; a node with work in use never for idleness."""
        reply = schedule(inp)
        by_id = {n.instance_id: n for n in inp.instances}
        for t in reply.terminations:
            node = by_id[t.instance_id]
            assert node.kind is NodeKind.WORKER
            if t.cause.value == "IDLE":
                assert (
                    dict(node.available) == dict(node.total)
                    or node.status is not InstanceStatus.RAY_RUNNING
                )

    @SETTINGS
    @given(inputs())
    def test_every_decision_has_a_reason(self, inp: SchedulingInput) -> None:
        """Each launched type, termination and infeasible shape appears in the reasons."""
        reply = schedule(inp)
        subjects = {d.subject for d in reply.reasons}
        for t in reply.launches:
            assert t in subjects
        for term in reply.terminations:
            assert term.reason and term.instance_id in subjects
        unplaced = {"infeasible", "capped", "pending-capacity"}
        assert len([d for d in reply.reasons if d.action in unplaced]) >= len(
            reply.infeasible_demands
        )

    @SETTINGS
    @given(inputs())
    def test_every_unplaced_request_has_one_verdict(self, inp: SchedulingInput) -> None:
        """Ray's infeasible list (a limit counts) is told apart, request for request: each
        unplaced shape has a verdict of the same count, and only a shape no node type fits
        (resources or labels) or one no limit explains is called infeasible."""
        reply = schedule(inp)
        verdicts = {
            (shape_key(w.resources), w.count): w
            for w in reply.waiting
            if w.kind is WaitKind.TASKS and not w.why.endswith("being added")
        }
        for d in reply.infeasible_demands:
            w = verdicts[(shape_key(d.resources), d.count)]
            fits = fitting_types(d.resources, d.selectors, inp.config.node_types)
            if fits and w.reason is WaitReason.INFEASIBLE:
                assert "cannot be placed now" not in w.why or "label selectors" in w.why

    @SETTINGS
    @given(inputs())
    def test_same_input_same_output(self, inp: SchedulingInput) -> None:
        """Deterministic: no clock, no randomness."""
        assert schedule(inp) == schedule(inp)


class TestResizeProperties:
    """In-place resizes stay within what the pod may do, and each says why."""

    @SETTINGS
    @given(inputs(ippr_heavy=True))
    def test_resizes_only_ippr_capable_pods_within_max_with_a_reason(
        self, inp: SchedulingInput
    ) -> None:
        """Type has a spec, pod has a status, target <= effective max, reason given."""
        reply = schedule(inp)
        by_id = {n.instance_id: n for n in inp.instances}
        subjects = {(d.action, d.subject) for d in reply.reasons}
        for r in reply.resizes:
            node = by_id[r.instance_id]
            spec = inp.config.node_types[node.node_type].ippr
            assert spec is not None and node.ippr is not None
            assert r.cpu <= node.ippr.max_cpu(spec) <= spec.max_cpu
            assert r.memory <= node.ippr.max_memory(spec) <= spec.max_memory
            assert r.reason and ("resize", r.instance_id) in subjects
            assert r.ray_node_id  # only pods with a raylet to sync with

    @SETTINGS
    @given(inputs(ippr_heavy=True))
    def test_resize_only_grows_at_rest_pods(self, inp: SchedulingInput) -> None:
        """A pod in flight or after a failure is never grown; only provider reverts go out."""
        reply = schedule(inp)
        by_id = {n.instance_id: n for n in inp.instances}
        for r in reply.resizes:
            st_ = by_id[r.instance_id].ippr
            assert st_ is not None
            if st_.k8s_resize_status != "new":
                assert st_.resizing_at is None and st_.last_failed_at is None
                assert r.cpu >= st_.current_cpu and r.memory >= st_.current_memory
