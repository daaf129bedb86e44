"""GCS-side actor scheduling: choose a node, lease a worker there, push the creation task.

:meth:`ActorScheduler.run` drives one scheduling attempt to its end and returns what happened
(:class:`Created` or :class:`Failed`); the actor manager awaits it in a task of its own and
applies the result on its lane, so this module changes no actor state.  The attempt object
records the leased worker as soon as the raylet grants it, so the manager can attribute a
worker death to the actor (and kill the worker if the actor is destroyed mid-creation).

Loop, until created or failed (the manager cancels the task when the actor is destroyed):

1. choose a node (:func:`~gcs.managers.actors.placement.choose_node`, a pure function) from
   the live cluster view; when none fits, the lease queues at the owner's raylet, which
   reports it as demand and spills it back once a node fits; no node at all: wait
   (backoff) and choose again; fatal: fail;
2. ``RequestWorkerLease`` at that raylet; a spillback (``retry_at_raylet_address``) leases
   again at the named raylet; a rejection or an unreachable raylet excludes the node for the
   next choice; a cancellation for a removed placement group, a failed runtime env or an
   unschedulable demand fails the actor, other cancellations retry;
   an actor of a job in a virtual cluster is kept inside it: when the policy chose a node
   that fits, the lease carries a hard node affinity to that node (a Ray raylet would
   otherwise re-decide SPREAD / DEFAULT itself and spill the lease to any node it knows),
   and a spillback to a node outside the cluster is not followed (the lease is retried);
3. ``PushTask`` the creation task to the leased worker; the worker unreachable: start over;
   an application error (the constructor raised): fail; else created.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from gcs.base.errors import GcsError, RayletUnreachable, RayStatusError, WorkerUnreachable
from gcs.managers.actors import states
from gcs.managers.actors.placement import Candidate, Demand, choose_node
from gcs.proto import common_pb2, core_worker_pb2, node_manager_pb2
from gcs.rpc.raylet_io.actors import ActorGateway

__all__ = [
    "ActorScheduler",
    "Attempt",
    "ClusterView",
    "Created",
    "Failed",
    "RetryPolicy",
    "lease_request",
    "leased_worker",
    "pin_to_node",
]

log = structlog.get_logger("gcs.actors.scheduler")
Sleep = Callable[[float], Awaitable[object]]
Failure = node_manager_pb2.RequestWorkerLeaseReply.SchedulingFailureType
LEASE_ID_SIZE = 32
"""Ray's LeaseID: a 4-byte counter then a 28-byte worker id."""
_APPLICATION_FAILURE = "Failed to create an actor due to the application failure"
_FATAL_CANCELLATIONS = {
    Failure.SCHEDULING_CANCELLED_PLACEMENT_GROUP_REMOVED: (
        "Could not create the actor because its associated placement group was removed."
    ),
    Failure.SCHEDULING_CANCELLED_RUNTIME_ENV_SETUP_FAILED: (
        "Could not create the actor because its associated runtime env failed to be created."
    ),
    Failure.SCHEDULING_CANCELLED_UNSCHEDULABLE: "",
    Failure.SCHEDULING_CANCELLED_WORKER_STARTUP_FAILED: (
        "Could not create the actor because worker startup repeatedly failed."
    ),
}


class ClusterView(Protocol):
    """What the scheduler reads about the cluster (the live implementation reads the node
    manager, resource cache, placement groups and virtual clusters)."""

    def candidates(self) -> list[Candidate]: ...

    def raylet_address(self, node_id: bytes) -> str | None: ...

    def allowed_nodes(self, job_id: bytes) -> frozenset[bytes] | None:
        """The job's virtual-cluster nodes (None: anywhere)."""
        ...


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    first_backoff_s: float = 0.1
    max_backoff_s: float = 2.0


@dataclass(slots=True)
class Attempt:
    """One scheduling attempt of one actor incarnation (the manager holds it)."""

    actor_id: bytes
    spec: common_pb2.TaskSpec
    owner_node_id: bytes
    actors_per_node: Mapping[bytes, int] = field(default_factory=dict)
    node_id: bytes = b""
    """The raylet currently asked (or granted)."""
    raylet_address: str = ""
    lease_id: bytes = b""
    """The lease asked for (cancelled with CancelWorkerLease if the attempt is dropped)."""
    worker: common_pb2.Address | None = None
    """The leased worker, once granted."""
    worker_pid: int = 0


@dataclass(frozen=True, slots=True)
class Created:
    worker: common_pb2.Address
    node_id: bytes
    pid: int
    resource_mapping: tuple[common_pb2.ResourceMapEntry, ...]
    borrowed_refs: tuple[common_pb2.ObjectReferenceCount, ...]
    repr_name: str = ""


@dataclass(frozen=True, slots=True)
class Failed:
    cause: common_pb2.ActorDeathCause
    message: str
    exiting_worker: common_pb2.Address | None = None
    """The constructor raised on this worker, which now exits and reports the exception
    (``creation_task_exception``, the serialized error the caller rebuilds); the cause
    here has its text only."""
    borrowed_refs: tuple[common_pb2.ObjectReferenceCount, ...] = ()
    """The failed creation's borrowed references (the owner settles them as Ray's does)."""


_lease_counter = itertools.count(1)


def lease_request(spec: common_pb2.TaskSpec) -> node_manager_pb2.RequestWorkerLeaseRequest:
    """The lease Ray's GCS asks for an actor creation task (``LeaseSpec`` from the spec)."""
    creation = spec.actor_creation_task_spec
    lease = common_pb2.LeaseSpec(
        lease_id=(next(_lease_counter) & 0xFFFFFFFF).to_bytes(4, "little") + os.urandom(28),
        job_id=spec.job_id,
        caller_address=spec.caller_address,
        type=spec.type,
        actor_id=creation.actor_id,
        is_detached_actor=creation.is_detached,
        root_detached_actor_id=spec.root_detached_actor_id,
        max_actor_restarts=creation.max_actor_restarts,
        required_resources=spec.required_resources,
        required_placement_resources=spec.required_placement_resources,
        scheduling_strategy=spec.scheduling_strategy,
        label_selector=spec.label_selector,
        depth=spec.depth,
        runtime_env_info=spec.runtime_env_info,
        dependencies=[arg.object_ref for arg in spec.args if arg.HasField("object_ref")],
        parent_task_id=spec.parent_task_id,
        language=spec.language,
        function_descriptor=spec.function_descriptor,
        dynamic_worker_options=creation.dynamic_worker_options,
        max_retries=spec.max_retries,
        attempt_number=spec.attempt_number,
        task_name=spec.name,
        fallback_strategy=spec.fallback_strategy,
    )
    return node_manager_pb2.RequestWorkerLeaseRequest(lease_spec=lease)


def pin_to_node(request: node_manager_pb2.RequestWorkerLeaseRequest, node_id: bytes) -> None:
    """Make the raylet grant the lease on ``node_id`` only (hard node affinity; the raylet
    queues it while busy).  A placement-group lease is left alone: its bundle resources
    exist only on the group's nodes."""
    strategy = request.lease_spec.scheduling_strategy
    if strategy.WhichOneof("scheduling_strategy") == "placement_group_scheduling_strategy":
        return
    strategy.Clear()
    strategy.node_affinity_scheduling_strategy.node_id = node_id
    strategy.node_affinity_scheduling_strategy.soft = False


def leased_worker(
    reply: node_manager_pb2.RequestWorkerLeaseReply, node_id: bytes, raylet_address: str
) -> common_pb2.Address:
    """The granted worker's full address.  Ray 2.60 raylets answer with the port and worker
    id only (seen on the wire): the worker runs on the raylet's host and node."""
    worker = common_pb2.Address()
    worker.CopyFrom(reply.worker_address)
    if not worker.ip_address:
        worker.ip_address = raylet_address.rsplit(":", 1)[0]
    if not worker.node_id:
        worker.node_id = node_id
    return worker


class ActorScheduler:
    def __init__(
        self,
        gateway: ActorGateway,
        view: ClusterView,
        *,
        sleep: Sleep,
        retry: RetryPolicy | None = None,
        raylet_timeout_s: float | None = None,
    ) -> None:
        self._gateway = gateway
        self._view = view
        self._retry = retry or RetryPolicy()
        self._sleep = sleep
        """The back-off between attempts (the injected clock's ``sleep``)."""
        self._raylet_timeout_s = raylet_timeout_s

    async def run(self, attempt: Attempt) -> Created | Failed:
        spec = attempt.spec
        resources = dict(spec.required_placement_resources or spec.required_resources)
        backoff = self._retry.first_backoff_s
        excluded: set[bytes] = set()
        while True:
            demand = Demand(
                resources=resources,
                strategy=spec.scheduling_strategy,
                owner_node_id=attempt.owner_node_id,
                allowed_nodes=self._view.allowed_nodes(spec.job_id),
                excluded=frozenset(excluded),
                label_selector=spec.label_selector if spec.HasField("label_selector") else None,
            )
            placement = choose_node(demand, self._with_counts(attempt))
            if placement.fatal:
                return Failed(states.unschedulable(placement.reason), placement.reason)
            outcome: Created | Failed | None = None
            target = placement.node_id or placement.queue_at
            log.debug(
                "actor.placing",
                actor_id=attempt.actor_id.hex(),
                node_id=target.hex() if target else None,
                why=placement.reason,
            )
            if target is not None:
                request = lease_request(spec)
                if demand.allowed_nodes is not None and placement.node_id is not None:
                    pin_to_node(request, placement.node_id)
                outcome = await self._try_node(
                    attempt, target, excluded, request, demand.allowed_nodes
                )
                if outcome is not None:
                    return outcome
            elif excluded:
                excluded.clear()  # every node was tried: give them all another chance
            else:
                log.debug("actor.waiting", actor_id=attempt.actor_id.hex(), why=placement.reason)
            await self._sleep(backoff)
            backoff = min(backoff * 2, self._retry.max_backoff_s)

    def _with_counts(self, attempt: Attempt) -> list[Candidate]:
        counts = attempt.actors_per_node
        if not counts:
            return self._view.candidates()
        return [
            dataclasses.replace(c, actors=counts.get(c.node_id, 0)) for c in self._view.candidates()
        ]

    async def _try_node(
        self,
        attempt: Attempt,
        node_id: bytes,
        excluded: set[bytes],
        request: node_manager_pb2.RequestWorkerLeaseRequest,
        allowed: frozenset[bytes] | None,
    ) -> Created | Failed | None:
        """Lease at ``node_id`` (following spillbacks inside ``allowed``), then push; None:
        try again."""
        attempt.lease_id = request.lease_spec.lease_id
        address = self._view.raylet_address(node_id)
        for _hop in range(8):  # spillback hops; a loop between raylets ends here
            if address is None:
                excluded.add(node_id)
                return None
            attempt.node_id, attempt.raylet_address, attempt.worker = node_id, address, None
            try:
                reply = await self._gateway.request_worker_lease(
                    node_id, address, request, self._raylet_timeout_s
                )
            except (RayletUnreachable, RayStatusError) as err:
                log.info("actor.lease_failed", actor_id=attempt.actor_id.hex(), error=err.message)
                excluded.add(node_id)
                return None
            if reply.canceled:
                if reply.failure_type in _FATAL_CANCELLATIONS:
                    message = _FATAL_CANCELLATIONS[reply.failure_type] or (
                        reply.scheduling_failure_message or "The actor is unschedulable."
                    )
                    if reply.failure_type == Failure.SCHEDULING_CANCELLED_RUNTIME_ENV_SETUP_FAILED:
                        cause = common_pb2.ActorDeathCause()
                        cause.runtime_env_failed_context.error_message = (
                            reply.scheduling_failure_message or message
                        )
                        return Failed(cause, message)
                    return Failed(states.unschedulable(message), message)
                return None
            if reply.rejected:
                excluded.add(node_id)
                return None
            if reply.worker_address.port == 0 and reply.retry_at_raylet_address.port:
                spill = reply.retry_at_raylet_address
                if allowed is not None and spill.node_id not in allowed:
                    log.info(
                        "actor.spillback_outside_virtual_cluster",
                        actor_id=attempt.actor_id.hex(),
                        node_id=spill.node_id.hex(),
                    )
                    return None
                log.debug(
                    "actor.spilled_back",
                    actor_id=attempt.actor_id.hex(),
                    by=node_id.hex(),
                    to=spill.node_id.hex(),
                )
                node_id = spill.node_id
                address = f"{spill.ip_address}:{spill.port}"
                continue
            if reply.worker_address.port == 0:
                excluded.add(node_id)
                return None
            return await self._push(attempt, leased_worker(reply, node_id, address), reply)
        excluded.add(node_id)
        return None

    async def _push(
        self,
        attempt: Attempt,
        worker: common_pb2.Address,
        lease: node_manager_pb2.RequestWorkerLeaseReply,
    ) -> Created | Failed | None:
        attempt.worker, attempt.worker_pid = worker, lease.worker_pid
        request = core_worker_pb2.PushTaskRequest(
            intended_worker_id=worker.worker_id,
            task_spec=attempt.spec,
            resource_mapping=lease.resource_mapping,
        )
        try:
            reply = await self._gateway.push_task(worker, request)
        except WorkerUnreachable as err:
            log.info("actor.push_failed", actor_id=attempt.actor_id.hex(), error=err.message)
            attempt.worker = None
            return None
        except GcsError as err:  # pragma: no cover - gateways raise the above
            log.warning("actor.push_error", actor_id=attempt.actor_id.hex(), error=err.message)
            attempt.worker = None
            return None
        if reply.is_application_error:
            message = reply.task_execution_error or _APPLICATION_FAILURE
            exception = common_pb2.RayException(
                language=common_pb2.PYTHON, formatted_exception_string=message
            )
            return Failed(
                states.creation_failed(exception),
                message,
                exiting_worker=worker,
                borrowed_refs=tuple(reply.borrowed_refs),
            )
        return Created(
            worker=worker,
            node_id=worker.node_id,
            pid=lease.worker_pid,
            resource_mapping=tuple(lease.resource_mapping),
            borrowed_refs=tuple(reply.borrowed_refs),
            repr_name=reply.actor_repr_name if reply.HasField("actor_repr_name") else "",
        )
