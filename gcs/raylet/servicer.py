"""``ray.rpc.NodeManagerService`` handlers of the raylet agent.

Lease requests follow Ray's reply semantics: the reply is sent when the lease is granted
(``worker_address`` set), when it is cancelled (``canceled``) or, with ``grant_or_reject``,
at once (``rejected`` if it cannot run now).  Queued and infeasible requests wait with the
RPC open and are reported in ``resource_load_by_shape`` meanwhile.  Synthetic work can ask
the raylet to free the lease itself after N seconds (metadata ``gcs-synthetic-seconds``) and
to reply at once while the lease stays in the raylet (``gcs-synthetic-detach: 1``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import dataclass
from typing import Any, Protocol

from gcs.base.clock import Clock
from gcs.proto import autoscaler_pb2, common_pb2, gcs_pb2, node_manager_pb2, ray_syncer_pb2
from gcs.raylet import convert
from gcs.raylet.resources import LeaseRequest, LocalResources, Placement
from gcs.rpc.errors import InvalidArgument

IDLE_DRAIN_REJECTED = "The node to be idle terminated is no longer idle."

_Reply = node_manager_pb2.RequestWorkerLeaseReply


def _bundle_key(bundle: common_pb2.Bundle) -> tuple[bytes, int]:
    return bundle.bundle_id.placement_group_id, bundle.bundle_id.bundle_index


class AgentControl(Protocol):
    """What the servicer asks of the agent that owns it."""

    def on_idle_drain_accepted(self, reason_message: str) -> None: ...
    def on_shutdown_requested(self, graceful: bool) -> None: ...
    def on_gcs_restarted(self) -> None: ...
    def on_view_changed(self) -> None:
        """Resources, idle/busy or draining may have changed (the syncer sends a view)."""


@dataclass(frozen=True)
class NodeIdentity:
    node_id: bytes
    address: str
    port: int
    worker_port: int = 0
    """Port every granted worker address names (one fake core worker serving them all, for
    benches that drive actor creation); 0: a distinct made-up port per lease."""


@dataclass
class _Held:
    request: LeaseRequest
    worker_port: int
    worker_id: bytes
    hold_s: float | None


class NodeManagerServicer:
    """Serves the RPCs a GCS (and synthetic drivers) call on a raylet."""

    def __init__(
        self,
        identity: NodeIdentity,
        resources: LocalResources,
        control: AgentControl,
        clock: Clock,
    ) -> None:
        self.identity = identity
        self.resources = resources
        self._control = control
        self._clock = clock
        self._idle_since: float | None = clock.monotonic_s()
        self.draining = False
        self.draining_deadline_ms = -1
        self._waiters: dict[bytes, asyncio.Future[_Reply]] = {}
        self._hold_s: dict[bytes, float | None] = {}
        self._held: dict[bytes, _Held] = {}
        self._by_port: dict[int, bytes] = {}
        self._ports = itertools.count(10_000)
        self._timers: set[asyncio.Task[None]] = set()
        self.polls = 0
        """GetResourceLoad calls answered."""
        self.last_polled_s: float | None = None
        """Monotonic time of the last GetResourceLoad (how stale the GCS's load view is)."""

    # -- state ---------------------------------------------------------------------------

    def idle_duration_ms(self) -> int:
        if self._idle_since is None:
            return 0
        return max(0, int((self._clock.monotonic_s() - self._idle_since) * 1000))

    def _refresh_idle(self) -> None:
        if self.resources.busy:
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = self._clock.monotonic_s()
        self._control.on_view_changed()

    def resource_view(self) -> ray_syncer_pb2.ResourceViewSyncMessage:
        """The syncer's RESOURCE_VIEW, as a 2.60 raylet fills it: availability clamped at 0,
        the idle duration at creation (at least 1 ms when idle), draining, and one
        ``node_activity`` line per resource in use."""
        resources = self.resources
        idle_ms = max(1, self.idle_duration_ms()) if self._idle_since is not None else 0
        view = ray_syncer_pb2.ResourceViewSyncMessage(
            resources_available={k: max(0.0, v) for k, v in resources.available.items()},
            resources_total=resources.total,
            idle_duration_ms=idle_ms,
            is_draining=self.draining,
            draining_deadline_timestamp_ms=self.draining_deadline_ms,
        )
        if not idle_ms:
            view.node_activity.extend(
                f"Resource: {name} currently in use."
                for name, total in sorted(resources.total.items())
                if resources.available.get(name, 0.0) < total
            )
        return view

    def resources_data(self) -> gcs_pb2.ResourcesData:
        summed, rows = self.resources.load()
        return gcs_pb2.ResourcesData(
            node_id=self.identity.node_id,
            resources_available={k: max(0.0, v) for k, v in self.resources.available.items()},
            resources_total=self.resources.total,
            resource_load=summed,
            resource_load_by_shape=gcs_pb2.ResourceLoad(
                resource_demands=[convert.demand_to_proto(r) for r in rows]
            ),
            node_manager_address=self.identity.address,
            idle_duration_ms=self.idle_duration_ms(),
            is_draining=self.draining,
            draining_deadline_timestamp_ms=self.draining_deadline_ms,
            labels=self.resources.labels,
        )

    def close(self) -> None:
        """Cancel hold timers and wake every waiting lease request with ``canceled``."""
        for timer in self._timers:
            timer.cancel()
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_result(_Reply(canceled=True, failure_type=_Reply.SCHEDULING_FAILED))
        self._waiters.clear()

    # -- GCS-facing RPCs -----------------------------------------------------------------

    async def GetResourceLoad(self, request: Any, context: Any) -> Any:
        self.polls += 1
        self.last_polled_s = self._clock.monotonic_s()
        return node_manager_pb2.GetResourceLoadReply(resources=self.resources_data())

    async def DrainRaylet(self, request: Any, context: Any) -> Any:
        reason = request.reason
        if reason == autoscaler_pb2.DRAIN_NODE_REASON_IDLE_TERMINATION:
            if self.resources.busy:
                return node_manager_pb2.DrainRayletReply(
                    is_accepted=False, rejection_reason_message=IDLE_DRAIN_REJECTED
                )
            self._mark_draining(request.deadline_timestamp_ms)
            self._control.on_idle_drain_accepted(request.reason_message)
        else:
            self._mark_draining(request.deadline_timestamp_ms)
        return node_manager_pb2.DrainRayletReply(is_accepted=True)

    def _mark_draining(self, deadline_ms: int) -> None:
        self.draining = True
        self.draining_deadline_ms = deadline_ms
        self._control.on_view_changed()

    async def ResizeLocalResourceInstances(self, request: Any, context: Any) -> Any:
        granted = self.resources.resize(dict(request.resources))
        self._after_grants(granted)
        return node_manager_pb2.ResizeLocalResourceInstancesReply(
            total_resources=self.resources.total
        )

    async def NotifyGCSRestart(self, request: Any, context: Any) -> Any:
        self._control.on_gcs_restarted()
        return node_manager_pb2.NotifyGCSRestartReply()

    async def ReleaseUnusedActorWorkers(self, request: Any, context: Any) -> Any:
        """The agent runs no actor workers: nothing to release (the GCS asks after a restart)."""
        return node_manager_pb2.ReleaseUnusedActorWorkersReply()

    async def KillLocalActor(self, request: Any, context: Any) -> Any:
        """The GCS kills an actor: its worker exits and its lease is freed, as a raylet does."""
        for lease_id, held in list(self._held.items()):
            if held.worker_id == request.worker_id:
                self._release(lease_id)
        return node_manager_pb2.KillLocalActorReply()

    async def ShutdownRaylet(self, request: Any, context: Any) -> Any:
        self._control.on_shutdown_requested(request.graceful)
        return node_manager_pb2.ShutdownRayletReply()

    # -- placement-group bundles (two-phase, driven by the GCS) ---------------------------

    async def PrepareBundleResources(self, request: Any, context: Any) -> Any:
        ok = self.resources.prepare_bundles(
            (_bundle_key(b), dict(b.unit_resources)) for b in request.bundle_specs
        )
        self._refresh_idle()
        return node_manager_pb2.PrepareBundleResourcesReply(success=ok)

    async def CommitBundleResources(self, request: Any, context: Any) -> Any:
        granted = self.resources.commit_bundles(_bundle_key(b) for b in request.bundle_specs)
        self._after_grants(granted)
        return node_manager_pb2.CommitBundleResourcesReply()

    async def RemovePlacementGroupBundles(self, request: Any, context: Any) -> Any:
        for bundle in request.bundle_specs:
            self._after_return(*self.resources.return_bundle(_bundle_key(bundle)))
        return node_manager_pb2.RemovePlacementGroupBundlesReply()

    async def ReleaseUnusedBundles(self, request: Any, context: Any) -> Any:
        in_use = {_bundle_key(b) for b in request.bundles_in_use}
        self._after_return(*self.resources.release_unused_bundles(in_use))
        return node_manager_pb2.ReleaseUnusedBundlesReply()

    # -- leases --------------------------------------------------------------------------

    async def RequestWorkerLease(self, request: Any, context: Any) -> Any:
        spec = request.lease_spec
        lease = LeaseRequest(
            lease_id=spec.lease_id or os.urandom(28),
            shape={k: v for k, v in spec.required_resources.items() if v > 0},
            selector=convert.selector_from_proto(spec.label_selector),
            backlog_size=request.backlog_size,
            job_id=spec.job_id,
        )
        metadata = context.invocation_metadata() if context is not None else ()
        hold = convert.metadata_value(metadata, convert.SYNTHETIC_SECONDS_KEY)
        try:
            hold_s = float(hold) if hold is not None else None
        except ValueError:
            raise InvalidArgument(f"{convert.SYNTHETIC_SECONDS_KEY} must be a number") from None
        detach = convert.metadata_value(metadata, convert.SYNTHETIC_DETACH_KEY) == "1"
        if self.draining:
            return _Reply(
                rejected=True,
                failure_type=_Reply.SCHEDULING_FAILED,
                scheduling_failure_message="the node is draining",
            )
        if request.grant_or_reject:
            if self.resources.try_grant_now(lease):
                return self._grant(lease, hold_s)
            return _Reply(rejected=True, resources_data=self.resources_data())

        placement = self.resources.submit(lease)
        if placement is Placement.GRANTED:
            return self._grant(lease, hold_s)
        self._hold_s[lease.lease_id] = hold_s
        if detach:
            return _Reply()  # the raylet owns the waiting lease from here on
        fut: asyncio.Future[_Reply] = asyncio.get_running_loop().create_future()
        self._waiters[lease.lease_id] = fut
        try:
            return await fut
        except asyncio.CancelledError:
            self._abandon(lease.lease_id)
            raise
        finally:
            self._waiters.pop(lease.lease_id, None)

    async def ReturnWorkerLease(self, request: Any, context: Any) -> Any:
        lease_id = request.lease_id or self._by_port.get(request.worker_port, b"")
        self._release(lease_id)
        return node_manager_pb2.ReturnWorkerLeaseReply()

    async def CancelWorkerLease(self, request: Any, context: Any) -> Any:
        if self.resources.cancel(request.lease_id):
            self._hold_s.pop(request.lease_id, None)
            fut = self._waiters.get(request.lease_id)
            if fut is not None and not fut.done():
                fut.set_result(
                    _Reply(canceled=True, failure_type=_Reply.SCHEDULING_CANCELLED_INTENDED)
                )
        return node_manager_pb2.CancelWorkerLeaseReply()

    # -- local work (benchmarks and tests: a lease taken without an RPC) ----------------

    def hold(self, shape: dict[str, float]) -> bytes | None:
        """Take a lease of ``shape`` now if it fits (its id), else None."""
        lease = LeaseRequest(lease_id=os.urandom(28), shape=shape)
        if not self.resources.try_grant_now(lease):
            return None
        self._grant(lease, None)
        return lease.lease_id

    def free(self, lease_id: bytes) -> None:
        self._release(lease_id)

    # -- internals -----------------------------------------------------------------------

    def _grant(self, lease: LeaseRequest, hold_s: float | None) -> _Reply:
        port = self.identity.worker_port or next(self._ports)
        held = _Held(lease, port, os.urandom(28), hold_s)
        self._held[lease.lease_id] = held
        if not self.identity.worker_port:
            self._by_port[held.worker_port] = lease.lease_id
        self._refresh_idle()
        if hold_s is not None:
            timer = asyncio.get_running_loop().create_task(self._free_after(lease, hold_s))
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)
        return _Reply(
            worker_address=common_pb2.Address(
                node_id=self.identity.node_id,
                ip_address=self.identity.address,
                port=held.worker_port,
                worker_id=held.worker_id,
            ),
            resource_mapping=[
                common_pb2.ResourceMapEntry(
                    name=name, resource_ids=[common_pb2.ResourceId(index=0, quantity=amount)]
                )
                for name, amount in sorted(lease.shape.items())
            ],
            worker_pid=os.getpid(),
        )

    async def _free_after(self, lease: LeaseRequest, hold_s: float) -> None:
        await self._clock.sleep(hold_s)
        if lease.lease_id in self._held:
            self._release(lease.lease_id)

    def _release(self, lease_id: bytes) -> None:
        granted = self.resources.release(lease_id)
        held = self._held.pop(lease_id, None)
        if held is not None:
            self._by_port.pop(held.worker_port, None)
        self._after_grants(granted)
        self._refresh_idle()

    def _after_grants(self, granted: list[bytes]) -> None:
        """Leases granted by a release or resize: answer their waiting RPCs."""
        for lease_id in granted:
            hold_s = self._hold_s.pop(lease_id, None)
            request = self.resources.granted_request(lease_id)
            reply = self._grant(request, hold_s)
            fut = self._waiters.get(lease_id)
            if fut is not None and not fut.done():
                fut.set_result(reply)
        self._refresh_idle()

    def _after_return(self, evicted: list[bytes], granted: list[bytes]) -> None:
        """Bundles went back: forget evicted leases (their workers are gone), answer grants."""
        for lease_id in evicted:
            held = self._held.pop(lease_id, None)
            if held is not None:
                self._by_port.pop(held.worker_port, None)
        self._after_grants(granted)

    def _abandon(self, lease_id: bytes) -> None:
        """The requester went away: drop its waiting request, or free it if just granted."""
        self._hold_s.pop(lease_id, None)
        if not self.resources.cancel(lease_id) and lease_id in self._held:
            self._release(lease_id)
