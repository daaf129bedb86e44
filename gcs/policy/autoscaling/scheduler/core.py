"""``schedule()``: Ray 2.60's policy in Ray's order, pure and deterministic.

outdated -> min per type -> max per type -> cluster max -> request_resources ->
placement groups -> tasks/actors -> idle termination. Every decision gets a reason.

Each step is a function over the round's state (:class:`.round_state.Round`), in a module
of its job: node limits (:mod:`.limits`), constraints and placement groups (:mod:`.gangs`),
task demand (:mod:`.demand`), scale-down (:mod:`.idle`) and the reply (:mod:`.reply`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gcs.policy.autoscaling.scheduler.demand import schedule_demand
from gcs.policy.autoscaling.scheduler.gangs import schedule_constraints, schedule_gangs
from gcs.policy.autoscaling.scheduler.idle import idle, pending_idle
from gcs.policy.autoscaling.scheduler.limits import (
    enforce_max_global,
    enforce_max_per_type,
    enforce_min_workers,
    terminate_outdated,
)
from gcs.policy.autoscaling.scheduler.reply import reply
from gcs.policy.autoscaling.scheduler.round_state import Round
from gcs.policy.autoscaling.scheduler.types import Decision, SchedulingInput, SchedulingReply

__all__ = ["schedule"]


def schedule(inp: SchedulingInput) -> SchedulingReply:
    """Decide launches, terminations and infeasibility for one round. Pure."""
    inp, deferred = _cap_work(inp)
    r = Round(inp)
    r.reasons.extend(deferred)
    terminate_outdated(r)
    enforce_min_workers(r)
    enforce_max_per_type(r)
    enforce_max_global(r)
    inf_c = schedule_constraints(r)
    inf_g = schedule_gangs(r)
    inf_d = schedule_demand(r)
    clocks = pending_idle(r)
    idle(r)
    return reply(r, inf_d, inf_g, inf_c, clocks)


def _cap_work(inp: SchedulingInput) -> tuple[SchedulingInput, list[Decision]]:
    """Apply :attr:`Options.max_work_units`: keep request shapes, then gangs (by bundles), in
    input order while the budget lasts, and say what waits."""
    o = inp.config.options
    per_kind = max(1, o.max_work_units // max(1, len(inp.instances)))
    deferred: list[Decision] = []
    changes: dict[str, Any] = {}
    if len(inp.demands) > per_kind:
        changes["demands"] = inp.demands[:per_kind]
        deferred.append(_deferred("demands", len(inp.demands), per_kind, "request shapes"))
    bundles, keep = 0, 0
    for gang in inp.gangs:
        bundles += max(1, len(gang.bundles))
        if bundles > per_kind and keep > 0:
            break
        keep += 1
    if keep < len(inp.gangs):
        changes["gangs"] = inp.gangs[:keep]
        deferred.append(_deferred("gangs", len(inp.gangs), keep, "placement groups"))
    if len(inp.constraints) > o.max_constraints:
        changes["constraints"] = inp.constraints[: o.max_constraints]
        deferred.append(
            _deferred(
                "constraints", len(inp.constraints), o.max_constraints, "resource constraints"
            )
        )
    return (replace(inp, **changes) if changes else inp), deferred


def _deferred(field: str, total: int, kept: int, what: str) -> Decision:
    return Decision(
        "deferred",
        field,
        f"{total - kept} of {total} {what} wait for a later round (work cap: {kept} this round)",
    )
