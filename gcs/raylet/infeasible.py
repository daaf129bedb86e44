"""``gcs submit`` and tasks that fit no alive node: say so at once, stop when it is final.

A task no alive node can hold is not necessarily hopeless: an autoscaler may add a node
type that fits it (that is the usual way a GPU task starts on a cluster with no GPU node up).
So, as Ray does with an infeasible task, ``gcs submit`` keeps it waiting and warns on stderr
at once.  What ends the wait is the autoscaler's own verdict: once the autoscaler reports
the task's shape among its infeasible requests (it cannot launch a node that fits: no node
type has the resources, or its limits are reached), ``gcs submit`` withdraws the tasks and
exits 1, as Ray's ``RAY_enable_infeasible_task_early_exit`` fails such tasks.  With no
autoscaler reporting, it keeps waiting (``--timeout`` bounds it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping

from gcs.proto import autoscaler_pb2


def shape_key(resources: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """A resource shape compared as Ray does: zero amounts do not count."""
    return tuple(sorted((k, float(v)) for k, v in resources.items() if v > 0))


def shape_text(resources: Mapping[str, float]) -> str:
    return json.dumps({k: v for k, v in sorted(resources.items())})


def infeasible_warning(infeasible: int, count: int, resources: Mapping[str, float]) -> str:
    """The line printed as soon as the tasks are placed."""
    return (
        f"{infeasible} of {count} tasks of {shape_text(resources)} fit no alive node; they wait "
        "for the autoscaler to add a node that fits (Ctrl-C to stop, --timeout to give up)"
    )


def autoscaler_verdict(
    reply: autoscaler_pb2.GetClusterStatusReply, resources: Mapping[str, float]
) -> bool:
    """True when the autoscaler reports this shape as infeasible (no node type fits it)."""
    scaling = reply.autoscaling_state
    if not scaling.autoscaler_state_version:
        return False  # no autoscaler has reported: nobody can say it is final
    wanted = shape_key(resources)
    return any(
        shape_key(dict(request.resources_bundle)) == wanted
        for request in scaling.infeasible_resource_requests
    )


def final_message(abandoned: int, count: int, resources: Mapping[str, float]) -> str:
    return (
        f"{abandoned} of {count} tasks of {shape_text(resources)} cannot start: the autoscaler "
        "lists them as infeasible (no node type it may launch fits them, within its limits); "
        "they were withdrawn"
    )


async def watch_for_verdict(
    address: str,
    resources: Mapping[str, float],
    stop: asyncio.Event,
    *,
    poll_s: float,
    timeout_s: float = 10.0,
) -> None:
    """Ask the GCS every ``poll_s`` whether the autoscaler declared the shape infeasible;
    set ``stop`` when it did.  A GCS that cannot answer is asked again next time."""
    from gcs.sdk import GcsSdkError, get_cluster_status_async

    while not stop.is_set():
        try:
            reply = await get_cluster_status_async(address, timeout_s=timeout_s)
        except GcsSdkError:
            reply = None
        if reply is not None and autoscaler_verdict(reply, resources):
            stop.set()
            return
        await asyncio.sleep(poll_s)
