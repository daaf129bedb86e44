"""The actor state machine as data, and the death causes Ray's core workers read.

States are Ray 2.60's ``ActorTableData.ActorState``.  Every edge names the observation that
causes it; :func:`check_transition` raises on any other (a bug, never a user error).
Death-cause messages are Ray's own strings (core workers show them in ``RayActorError``).
"""

from __future__ import annotations

from gcs.proto import common_pb2, gcs_pb2

__all__ = [
    "ALIVE",
    "DEAD",
    "DEPENDENCIES_UNREADY",
    "OWNER_NODE_DIED",
    "OWNER_WORKER_DIED",
    "PENDING_CREATION",
    "RESTARTING",
    "TRANSITIONS",
    "IllegalTransition",
    "check_transition",
    "creation_failed",
    "killed_by_ray_kill",
    "node_died",
    "not_loadable",
    "out_of_scope",
    "owner_died",
    "remaining_restarts",
    "unschedulable",
    "worker_died",
]

Actor = gcs_pb2.ActorTableData
DEPENDENCIES_UNREADY = Actor.DEPENDENCIES_UNREADY
PENDING_CREATION = Actor.PENDING_CREATION
ALIVE = Actor.ALIVE
RESTARTING = Actor.RESTARTING
DEAD = Actor.DEAD
Reason = common_pb2.ActorDiedErrorContext.Reason

TRANSITIONS: dict[int, frozenset[int]] = {
    DEPENDENCIES_UNREADY: frozenset(
        {
            PENDING_CREATION,  # CreateActor: the owner resolved the constructor's arguments
            DEAD,  # owner died / job finished / ray.kill before creation was asked for
        }
    ),
    PENDING_CREATION: frozenset(
        {
            ALIVE,  # PushTask of the creation task answered OK
            RESTARTING,  # the leased worker or its node died during creation (restarts left)
            DEAD,  # killed, owner died, unschedulable, constructor raised, no restarts left
        }
    ),
    ALIVE: frozenset(
        {
            RESTARTING,  # its worker or node died, or ray.kill(no_restart=False)
            DEAD,  # the same with no restarts left; ray.kill; owner died; out of scope
        }
    ),
    RESTARTING: frozenset(
        {
            ALIVE,  # the new incarnation's creation task answered OK
            RESTARTING,  # the replacement worker died too (restarts left)
            DEAD,  # no restarts left, killed, owner died
        }
    ),
    DEAD: frozenset(
        {
            RESTARTING,  # RestartActorForLineageReconstruction of an out-of-scope actor
        }
    ),
}


class IllegalTransition(RuntimeError):
    """A state change the table does not allow (a bug in the manager)."""


def check_transition(actor_id: bytes, old: int, new: int) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(
            f"actor {actor_id.hex()}: {Actor.ActorState.Name(old)} -> "
            f"{Actor.ActorState.Name(new)} is not a valid transition"
        )


def remaining_restarts(actor: gcs_pb2.ActorTableData) -> int | None:
    """Restarts left (None = unlimited).  Restarts caused by node preemption do not count
    against ``max_restarts`` (Ray 2.60)."""
    if actor.max_restarts < 0:
        return None
    used = actor.num_restarts - actor.num_restarts_due_to_node_preemption
    return max(0, actor.max_restarts - used)


Cause = common_pb2.ActorDeathCause


def _context(actor: gcs_pb2.ActorTableData, reason: int, message: str) -> Cause:
    cause = common_pb2.ActorDeathCause()
    ctx = cause.actor_died_error_context
    ctx.reason = reason  # type: ignore[assignment]
    ctx.error_message = message
    ctx.actor_id = actor.actor_id
    ctx.owner_id = actor.owner_address.worker_id
    ctx.owner_ip_address = actor.owner_address.ip_address
    ctx.node_ip_address = actor.address.ip_address
    ctx.pid = actor.pid
    ctx.name = actor.name
    ctx.ray_namespace = actor.ray_namespace
    ctx.class_name = actor.class_name
    ctx.never_started = actor.state in (DEPENDENCIES_UNREADY, PENDING_CREATION)
    return cause


def killed_by_ray_kill(actor: gcs_pb2.ActorTableData) -> common_pb2.ActorDeathCause:
    message = "The actor is dead because it was killed by `ray.kill`."
    return _context(actor, Reason.RAY_KILL, message)


def out_of_scope(actor: gcs_pb2.ActorTableData) -> common_pb2.ActorDeathCause:
    return _context(
        actor,
        Reason.OUT_OF_SCOPE,
        "The actor is dead because all references to the actor were removed.",
    )


OWNER_WORKER_DIED = "Owner's worker process has crashed."
"""Ray's detail for an actor whose owner's worker died, whatever that worker's own exit
detail was (a driver's ``ray.shutdown()`` included)."""
OWNER_NODE_DIED = "Owner's node has crashed."
"""Ray's detail for an actor whose owner's node died (exit type ``SYSTEM_ERROR``)."""


def owner_died(
    actor: gcs_pb2.ActorTableData,
    exit_type: str = "",
    exit_detail: str = "",
    *,
    owner_ip: str = "",
) -> common_pb2.ActorDeathCause:
    """The owner (a worker or driver) died.  With ``exit_type`` the message is Ray's in
    full (``... Owner worker exit type: T Worker exit detail: D``; ``owner_ip``: the dead
    worker's or node's address, the actor's owner address when not given)."""
    message = (
        "The actor is dead because its owner has died. Owner Id: "
        f"{actor.owner_address.worker_id.hex()} Owner Ip address: "
        f"{owner_ip or actor.owner_address.ip_address}"
    )
    if exit_type:
        message += f" Owner worker exit type: {exit_type} Worker exit detail: {exit_detail}"
    return _context(actor, Reason.OWNER_DIED, message)


def not_loadable(actor: gcs_pb2.ActorTableData) -> Cause:
    """Found at start-up owned by a node that is gone (Ray's message)."""
    return _context(
        actor,
        Reason.OWNER_DIED,
        "The actor is dead because GCS could not load it during initialization (for "
        "example, its owner is dead) and is removing its task spec.",
    )


def worker_died(
    actor: gcs_pb2.ActorTableData, exit_type: str, exit_detail: str
) -> common_pb2.ActorDeathCause:
    message = (
        f"The actor is dead because its worker process has died. Worker exit type: {exit_type}"
    )
    if exit_detail:
        message += f" Worker exit detail: {exit_detail}"
    return _context(actor, Reason.WORKER_DIED, message)


_NODE_DEATH = {
    common_pb2.NodeDeathInfo.EXPECTED_TERMINATION: "the actor's node was terminated expectedly",
    common_pb2.NodeDeathInfo.UNEXPECTED_TERMINATION: "the actor's node was terminated unexpectedly",
    common_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED: "the actor's node was preempted",
    common_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_IDLE: "the actor's node was terminated",
}


def node_died(actor: gcs_pb2.ActorTableData, node: gcs_pb2.GcsNodeInfo) -> Cause:
    message = f"The actor died because its node has died. Node Id: {node.node_id.hex()}"
    what = _NODE_DEATH.get(node.death_info.reason)
    if what is not None:
        message += f"\n\t{what}: {node.death_info.reason_message}"
    cause = _context(actor, Reason.NODE_DIED, message)
    cause.actor_died_error_context.node_death_info.CopyFrom(node.death_info)
    return cause


def unschedulable(message: str) -> common_pb2.ActorDeathCause:
    cause = common_pb2.ActorDeathCause()
    cause.actor_unschedulable_context.error_message = message
    return cause


def creation_failed(exception: common_pb2.RayException) -> common_pb2.ActorDeathCause:
    """The constructor raised: the whole exception, its serialized form included (the
    caller's ``RayActorError`` deserializes it; without it Ray raises
    ``UnserializableException`` instead)."""
    cause = common_pb2.ActorDeathCause()
    cause.creation_task_failure_context.CopyFrom(exception)
    return cause
