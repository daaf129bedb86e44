"""The reply of a round: launches with their reasons, in-place resizes, terminations, the
cluster's resources and the clocks carried into the next round."""

from __future__ import annotations

from collections import defaultdict

from gcs.policy.autoscaling.scheduler.explain import explain_choice, score_text
from gcs.policy.autoscaling.scheduler.nodes import NodeStatus, Source
from gcs.policy.autoscaling.scheduler.packing import LaunchNote
from gcs.policy.autoscaling.scheduler.resources import memory_text, shape_text
from gcs.policy.autoscaling.scheduler.round_state import Round
from gcs.policy.autoscaling.scheduler.types import (
    ClusterConstraint,
    Decision,
    GangRequest,
    IpprStatus,
    NodeKind,
    Resize,
    ResourceDemand,
    SchedulingReply,
)

__all__ = ["reply"]


def _launch_reasons(r: Round, launches: dict[str, int]) -> None:
    by_type: dict[str, list[LaunchNote]] = defaultdict(list)
    for note in r.notes:
        by_type[note.node_type].append(note)
    excluded = r.excluded()
    texts: dict[int, str] = {}  # id(demand) -> its text: a few shapes, many notes
    for t, notes in by_type.items():
        if t not in launches:
            continue
        placed: dict[str, int] = defaultdict(int)
        for note in notes:
            for d, k in note.placed:
                text = texts.get(id(d))
                if text is None:
                    text = texts[id(d)] = shape_text(d.resources)
                placed[text] += k
        what = ", ".join(f"{k} pending {s} requests" for s, k in placed.items())
        first = notes[0]
        others = {k: v for k, v in excluded.items() if k != t}
        why = explain_choice(t, first.placed, first.runner_up, r.cfg.node_types, others)
        text = f"launch {len(notes)} x {t}: {what}; {why}"
        detail = f"{t}: {score_text(first.score)}"
        ru = first.runner_up
        if ru is not None:
            detail += f"; runner-up {ru[0]}: {score_text(ru[1])}"
        spec = r.cfg.node_types[t].ippr
        if spec is not None:
            text += (
                f"; counted at its IPPR max (CPU {spec.max_cpu:g}, memory "
                f"{memory_text(spec.max_memory)}) since it can be resized in place once running"
            )
        r.reasons.append(Decision("launch", t, text, detail))


def _resizes(r: Round) -> tuple[Resize, ...]:
    """Ray's ``to_ippr``: every pod with a resize queued and a raylet to sync with."""
    out = []
    for n in r.nodes:
        st = n.ippr
        if st is None or st.k8s_resize_status != "new":
            continue
        reason = n.resize_reason or _provider_resize_reason(st)
        if not st.has_resize_to_send():
            r.reasons.append(
                Decision(
                    "skip",
                    n.instance_id,
                    f"resize of {n.instance_id} not sent: no raylet on the pod yet "
                    f"(wanted: {reason})",
                )
            )
            continue
        out.append(
            Resize(
                instance_id=n.instance_id,
                cloud_instance_id=n.instance.cloud_instance_id if n.instance else "",
                ray_node_id=st.raylet_id,
                node_type=n.node_type,
                cpu=float(st.desired_cpu),  # type: ignore[arg-type]
                memory=float(st.desired_memory),  # type: ignore[arg-type]
                current_cpu=st.current_cpu,
                current_memory=st.current_memory,
                reason=reason,
            )
        )
        r.reasons.append(Decision("resize", n.instance_id, reason))
    return tuple(out)


def _provider_resize_reason(st: IpprStatus) -> str:
    target = f"CPU {st.desired_cpu:g}, memory {memory_text(st.desired_memory)}"  # type: ignore[arg-type,str-format]
    if st.last_failed_at is not None:
        why = st.last_failed_reason or "resize failed"
        return f"revert to {target} after a failed resize ({why}), queued by the provider"
    return f"resize to {target} queued by the provider"


def reply(
    r: Round,
    inf_d: list[ResourceDemand],
    inf_g: list[GangRequest],
    inf_c: list[ClusterConstraint],
    pending_clocks: dict[str, tuple[float, ...]],
) -> SchedulingReply:
    """What the round decided, as the caller reads it (the launch, resize, terminate and
    skip reasons are added here, after every step has run)."""
    launches: dict[str, int] = {}
    for n in r.nodes:
        if n.status is NodeStatus.TO_LAUNCH:
            launches[n.node_type] = launches.get(n.node_type, 0) + 1
    _launch_reasons(r, launches)
    resizes = _resizes(r)
    terms = tuple(
        n.termination for n in r.nodes if n.status is NodeStatus.TO_TERMINATE and n.termination
    )
    for t in terms:
        r.reasons.append(
            Decision("terminate", t.instance_id, f"terminate {t.instance_id}: {t.reason}")
        )
    cluster: dict[str, float] = defaultdict(float)
    for n in r.nodes:
        if n.status is not NodeStatus.TO_TERMINATE:
            for k, v in n.total.items():
                cluster[k] += v
    running_workers = any(n.is_running and n.kind is NodeKind.WORKER for n in r.nodes)
    launch_now = tuple(launches) if r.opts.cold_start_full_batch and not running_workers else ()
    for blocked_type in sorted(r.blocked):
        r.reasons.append(
            Decision(
                "skip",
                blocked_type,
                f"not launching {blocked_type}: it {r.blocked_why[blocked_type]}",
            )
        )
    return SchedulingReply(
        launches=launches,
        terminations=terms,
        infeasible_demands=tuple(inf_d),
        infeasible_gangs=tuple(inf_g),
        infeasible_constraints=tuple(inf_c),
        cluster_resources=dict(cluster),
        reasons=tuple(r.reasons),
        launch_now_types=launch_now,
        last_work_s=_next_last_work(r),
        pending_since_s=pending_clocks,
        unavailable_types=tuple(sorted(r.blocked)),
        resizes=resizes,
        waiting=tuple(r.waiting),
    )


def _next_last_work(r: Round) -> dict[str, float]:
    if not r.opts.own_idle_clock:
        return {}
    out = {}
    for n in r.nodes:
        if n.instance is None or n.status is NodeStatus.TO_TERMINATE:
            continue
        iid = n.instance_id
        if n.placed[Source.DEMAND]:
            out[iid] = r.inp.now_s
        elif iid in r.last_work:
            out[iid] = r.last_work[iid]
    return out
