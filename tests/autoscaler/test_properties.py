"""Hypothesis properties of ``schedule`` over random clusters and demand."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gcs.autoscaler.scheduler import (
    InstanceStatus,
    NodeInstance,
    NodeKind,
    NodeTypeConfig,
    ResourceDemand,
    SchedulerConfig,
    SchedulingInput,
    schedule,
)
from gcs.autoscaler.scheduler.types import SCHEDULABLE_STATUSES

TYPES = {
    "head": NodeTypeConfig("head", {"CPU": 0}, 0, 1),
    "small": NodeTypeConfig("small", {"CPU": 2, "memory": 8}, 0, 6),
    "big": NodeTypeConfig("big", {"CPU": 16, "memory": 64}, 0, 3),
    "gpu": NodeTypeConfig("gpu", {"CPU": 8, "GPU": 2}, 0, 2, labels={"acc": "A100"}),
}


@st.composite
def inputs(draw: st.DrawFn) -> SchedulingInput:
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
        t = draw(st.sampled_from(["small", "big", "gpu"]))
        status = draw(
            st.sampled_from(
                [InstanceStatus.RAY_RUNNING, InstanceStatus.REQUESTED, InstanceStatus.ALLOCATED]
            )
        )
        total = dict(TYPES[t].resources)
        frac = draw(st.sampled_from([0.0, 0.5, 1.0]))
        avail = {k: v * frac for k, v in total.items()}
        running = status is InstanceStatus.RAY_RUNNING
        nodes.append(
            NodeInstance(f"i{i}", t, status, ray_node_id=f"r{i}" if running else "", total=total,
                         available=avail, idle_duration_ms=draw(st.integers(0, 10**6)))
        )  # fmt: skip
    shapes = [{"CPU": 1}, {"CPU": 4, "memory": 16}, {"GPU": 1}, {"CPU": 32}, {"CPU": 0.5}]
    demands = tuple(
        ResourceDemand(draw(st.sampled_from(shapes)), draw(st.integers(1, 30)))
        for _ in range(draw(st.integers(0, 4)))
    )
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


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
        assert len([d for d in reply.reasons if d.action == "infeasible"]) >= len(
            reply.infeasible_demands
        )

    @SETTINGS
    @given(inputs())
    def test_same_input_same_output(self, inp: SchedulingInput) -> None:
        """Deterministic: no clock, no randomness."""
        assert schedule(inp) == schedule(inp)
