"""Instance-manager subscribers that act on the outside world (Ray 2.60 §2.6).

- :class:`CloudInstanceUpdater`: REQUESTED events -> one ``provider.launch`` per launch
  request id; TERMINATING events -> one ``provider.terminate``.  A provider call that raises
  or hangs past its timeout (on the injected clock) becomes a Launch/TerminateNodeError for
  the next round, never an exception in the reconcile loop.
- :class:`RayStopper`: RAY_STOP_REQUESTED events -> drain the node through the GCS (idle:
  DrainNode IDLE_TERMINATION, which a busy raylet rejects; other causes: stop now).  A
  rejection or failure is reported to the next round, which puts the instance back to
  RAY_RUNNING.

Both run their I/O as tasks of their own :class:`~gcs.base.background.Background` (its failure
policy: nothing fails unseen; ``close()`` cancels them) and record what they did in the
:class:`~gcs.autoscaler.reconciler.events.EventLog`.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence

import structlog

from gcs.autoscaler.gcs_api import AutoscalerGcs
from gcs.autoscaler.instances.manager import InstanceEvent
from gcs.autoscaler.providers.base import (
    CloudProvider,
    LaunchNodeError,
    ProviderError,
    TerminateNodeError,
)
from gcs.autoscaler.reconciler.events import EventLog
from gcs.base.background import Background
from gcs.base.clock import Clock, within
from gcs.policy.autoscaling.model import InstanceStatus

log = structlog.get_logger("gcs.autoscaler")


class CloudInstanceUpdater:
    def __init__(
        self,
        provider: CloudProvider,
        clock: Clock,
        events: EventLog,
        *,
        call_timeout_s: float = 60.0,
    ) -> None:
        self._provider = provider
        self._clock = clock
        self._events = events
        self._timeout_s = call_timeout_s
        self._errors: list[ProviderError] = []
        self._tasks = Background("autoscaler.launcher")
        self.launched = 0
        self.terminated = 0

    def poll_errors(self) -> list[ProviderError]:
        errors, self._errors = self._errors, []
        return errors

    def notify(self, events: Sequence[InstanceEvent]) -> None:
        launches: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        to_terminate: list[str] = []
        for ev in events:
            inst = ev.instance
            if inst.status is InstanceStatus.REQUESTED:
                launches[inst.launch_request_id][inst.instance_type] += 1
            elif inst.status is InstanceStatus.TERMINATING and inst.cloud_instance_id:
                to_terminate.append(inst.cloud_instance_id)
        for request_id, counts in launches.items():
            self._tasks.spawn(self._launch(dict(counts), request_id), "launch")
        if to_terminate:
            ids = sorted(set(to_terminate))
            self._tasks.spawn(self._terminate(ids, uuid.uuid4().hex), "terminate")

    async def _launch(self, shape: dict[str, int], request_id: str) -> None:
        what = ", ".join(f"{n} x {t}" for t, n in shape.items())
        try:
            await within(self._clock, self._timeout_s, self._provider.launch(shape, request_id))
        except Exception as err:  # the provider's failure is data for the next round
            reason = _reason(err, self._timeout_s)
            now = int(self._clock.now_s() * 1e9)
            for node_type, count in shape.items():
                self._errors.append(LaunchNodeError(node_type, count, request_id, now, reason))
            self._events.add("launch-failed", f"Failed to launch {what}: {reason}")
            log.warning(
                "autoscaler.launch_failed", shape=shape, request_id=request_id, error=reason
            )
            return
        self.launched += sum(shape.values())
        self._events.add("launch", f"Adding {what}")

    async def _terminate(self, ids: list[str], request_id: str) -> None:
        try:
            await within(self._clock, self._timeout_s, self._provider.terminate(ids, request_id))
        except Exception as err:
            reason = _reason(err, self._timeout_s)
            now = int(self._clock.now_s() * 1e9)
            self._errors.extend(TerminateNodeError(cid, request_id, now, reason) for cid in ids)
            self._events.add("terminate-failed", f"Failed to terminate {len(ids)} nodes: {reason}")
            log.warning("autoscaler.terminate_failed", ids=ids, error=reason)
            return
        self.terminated += len(ids)
        self._events.add("terminate", f"Removing {len(ids)} nodes: {', '.join(ids)}")

    async def settle(self) -> None:
        await self._tasks.settle()

    async def close(self) -> None:
        await self._tasks.close()


class RayStopper:
    def __init__(self, gcs: AutoscalerGcs, events: EventLog) -> None:
        self._gcs = gcs
        self._events = events
        self._errors: dict[str, str] = {}
        self._tasks = Background("autoscaler.ray_stopper")

    def poll_errors(self) -> dict[str, str]:
        """instance id -> why its stop failed (the next round puts it back to RAY_RUNNING)."""
        errors, self._errors = self._errors, {}
        return errors

    def notify(self, events: Sequence[InstanceEvent]) -> None:
        for ev in events:
            inst = ev.instance
            if inst.status is not InstanceStatus.RAY_STOP_REQUESTED or not inst.node_id:
                continue
            self._tasks.spawn(self._stop(inst), "ray-stop")

    async def _stop(self, inst) -> None:  # type: ignore[no-untyped-def]
        term = inst.termination
        try:
            if term is not None and term.cause == "IDLE":
                secs = term.idle_duration_ms / 1000
                result = await self._gcs.drain_idle(
                    inst.node_id, f"Termination of node that's idle for {secs:g} seconds."
                )
                if not result.accepted:
                    self._errors[inst.instance_id] = (
                        f"drain rejected: {result.rejection_reason or 'node is busy'}"
                    )
                    self._events.add(
                        "drain-rejected",
                        f"Node {inst.node_id[:8]} ({inst.instance_type}) refused to drain: "
                        f"{result.rejection_reason or 'busy'}",
                    )
                    return
            elif not await self._gcs.stop_node(inst.node_id):
                self._errors[inst.instance_id] = "stop request returned no node"
                return
        except Exception as err:
            self._errors[inst.instance_id] = f"stop failed: {err}"
            log.warning("autoscaler.stop_failed", instance=inst.instance_id, error=str(err))
            return
        why = term.details if term is not None else "requested"
        self._events.add("drain", f"Draining node {inst.node_id[:8]} ({inst.instance_type}): {why}")

    async def settle(self) -> None:
        await self._tasks.settle()

    async def close(self) -> None:
        await self._tasks.close()


def _reason(err: BaseException, timeout_s: float) -> str:
    if isinstance(err, TimeoutError):
        return f"the provider did not answer within {timeout_s:g} s"
    return f"{type(err).__name__}: {err}"
