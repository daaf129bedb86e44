"""``gcs submit`` and tasks that fit no alive node: say so at once, stop when it is final.

A task no alive node can hold is not necessarily hopeless: an autoscaler may add a node
type that fits it (that is the usual way a GPU task starts on a cluster with no GPU node up).
So, as Ray does with an infeasible task, ``gcs submit`` keeps it waiting and warns on stderr
at once.  What ends the wait is the autoscaler's own verdict on why the shape waits
(:mod:`gcs.policy.autoscaling.scheduler.waiting`, published each round): only when *no node type
fits* the shape (``infeasible``) are the tasks withdrawn, exit 1, as Ray's
``RAY_enable_infeasible_task_early_exit`` fails such tasks.  A shape a node-type limit holds
back (``capped``: max_workers, the cluster's or a virtual cluster's cap) or one waiting on a
node being added is kept: it runs when capacity frees.  Ray's own infeasible list on the
wire counts the capped ones too, so it is not what decides.  With no verdict published (no
autoscaler of ours) it keeps waiting (``--timeout`` bounds it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from gcs.policy.autoscaling.scheduler.waiting import WaitingDemand, WaitReason, verdict_for


def shape_text(resources: Mapping[str, float]) -> str:
    return json.dumps({k: v for k, v in sorted(resources.items())})


def infeasible_warning(infeasible: int, count: int, resources: Mapping[str, float]) -> str:
    """The line printed as soon as the tasks are placed."""
    return (
        f"{infeasible} of {count} tasks of {shape_text(resources)} fit no alive node; they wait "
        "for the autoscaler to add a node that fits (Ctrl-C to stop, --timeout to give up)"
    )


def autoscaler_verdict(
    waiting: tuple[WaitingDemand, ...] | None, resources: Mapping[str, float]
) -> bool:
    """True when the autoscaler's verdict on this shape (submitted outside any virtual
    cluster) is that no node type fits it."""
    if waiting is None:
        return False  # no autoscaler has published: nobody can say it is final
    return verdict_for(waiting, resources) is WaitReason.INFEASIBLE


def final_message(abandoned: int, count: int, resources: Mapping[str, float]) -> str:
    return (
        f"{abandoned} of {count} tasks of {shape_text(resources)} cannot start: the autoscaler "
        "finds no node type that fits them; they were withdrawn"
    )


async def watch_for_verdict(
    address: str,
    resources: Mapping[str, float],
    stop: asyncio.Event,
    *,
    poll_s: float,
    timeout_s: float = 10.0,
) -> None:
    """Ask the GCS every ``poll_s`` for the autoscaler's verdict on the shape; set ``stop``
    when it is infeasible.  A GCS that cannot answer is asked again next time."""
    from gcs.sdk import GcsSdkError, get_autoscaler_waiting_async

    while not stop.is_set():
        try:
            waiting = await get_autoscaler_waiting_async(address, timeout_s=timeout_s)
        except GcsSdkError:
            waiting = None
        if autoscaler_verdict(waiting, resources):
            stop.set()
            return
        await asyncio.sleep(poll_s)
