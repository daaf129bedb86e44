"""The packer reuses an evaluation while it provably holds; the decisions are exactly those
of evaluating every candidate anew at every pick (the packer with reuse turned off)."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

from hypothesis import given
from hypothesis import strategies as st

from gcs.policy.autoscaling.model import InstanceStatus
from gcs.policy.autoscaling.scheduler import (
    GangRequest,
    LabelConstraint,
    LabelOp,
    NodeInstance,
    ResourceDemand,
    SchedulerConfig,
    SchedulingInput,
    packing,
    schedule,
)
from tests.autoscaler.test_properties import SETTINGS, TYPES, inputs

SHAPES = [{"CPU": 1}, {"CPU": 4, "memory": 16}, {"GPU": 1}, {"CPU": 0.5}, {"CPU": 3}]
ZONE = (LabelConstraint("zone", LabelOp.IN, ("a",)),)


@st.composite
def richer(draw: st.DrawFn) -> SchedulingInput:
    """``inputs()`` plus placement groups of every strategy, label selectors and many
    identical pending nodes (where reuse pays)."""
    inp = draw(inputs())
    gangs = []
    for g in range(draw(st.integers(0, 3))):
        strategy = draw(st.sampled_from(["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]))
        tag = ("_PG_group", f"g{g}")
        shape = draw(st.sampled_from(SHAPES))
        bundles = tuple(
            ResourceDemand(
                shape,
                1,
                affinity=tag if strategy == "STRICT_PACK" else None,
                anti_affinity=tag if strategy == "STRICT_SPREAD" else None,
            )
            for _ in range(draw(st.integers(1, 4)))
        )
        gangs.append(GangRequest(bundles, f"g{g}:{strategy}|PENDING", strategy=strategy))
    extra = tuple(
        ResourceDemand(
            draw(st.sampled_from(SHAPES)),
            draw(st.integers(1, 40)),
            selectors=(ZONE,) if draw(st.booleans()) else (),
        )
        for _ in range(draw(st.integers(0, 3)))
    )
    pending = tuple(
        NodeInstance(f"p{i}", draw(st.sampled_from(["small", "big"])), InstanceStatus.REQUESTED)
        for i in range(draw(st.integers(0, 12)))
    )
    return replace(
        inp, instances=inp.instances + pending, demands=inp.demands + extra, gangs=tuple(gangs)
    )


def without_reuse(inp: SchedulingInput):  # type: ignore[no-untyped-def]
    with (
        mock.patch.object(packing, "_still_valid", lambda *a: False),
        mock.patch.object(packing, "_same_state", lambda *a: False),
    ):
        return schedule(inp)


class TestReuse:
    @SETTINGS
    @given(richer())
    def test_same_decisions_as_evaluating_every_pick(self, inp: SchedulingInput) -> None:
        assert schedule(inp) == without_reuse(inp)

    def test_identical_pending_nodes_fill_with_one_evaluation(self) -> None:
        """Sanity: reuse happens (else the property above proves nothing)."""
        inp = SchedulingInput(
            config=SchedulerConfig(dict(TYPES)),
            instances=tuple(
                NodeInstance(f"p{i}", "small", InstanceStatus.REQUESTED) for i in range(50)
            ),
            demands=(ResourceDemand({"CPU": 1}, 200),),
        )
        calls = 0
        real = packing._evaluate

        def counting(*a):  # type: ignore[no-untyped-def]
            nonlocal calls
            calls += 1
            return real(*a)

        with mock.patch.object(packing, "_evaluate", counting):
            reply = schedule(inp)
        assert calls < 10
        assert reply == without_reuse(inp)
