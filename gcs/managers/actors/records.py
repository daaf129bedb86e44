"""Values every phase shares: table names, the records Ray builds, the replies it sends.

Pure functions of their arguments (no state, no I/O): the ``ActorTableData`` Ray builds at
registration, the validation of a creation spec, and the ``CreateActorReply`` shapes.
"""

from __future__ import annotations

from gcs.base.errors import InvalidArgument
from gcs.managers.actors import states
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2

__all__ = [
    "ACTOR_ID_SIZE",
    "CREATION_EXIT_REPORT_GRACE_S",
    "MAX_DEAD_CACHED",
    "NIL_ACTOR_ID",
    "TABLE_ACTOR",
    "TABLE_ACTOR_TASK_SPEC",
    "Actor",
    "CreateOutcome",
    "cancelled_reply",
    "copy_of",
    "created_reply",
    "ok",
    "table_data",
    "validated",
]

TABLE_ACTOR = "ACTOR"
TABLE_ACTOR_TASK_SPEC = "ACTOR_TASK_SPEC"
ACTOR_ID_SIZE = 16
NIL_ACTOR_ID = b"\xff" * ACTOR_ID_SIZE
MAX_DEAD_CACHED = 100_000
"""Ray's ``maximum_gcs_destroyed_actor_cached_count``."""
CREATION_EXIT_REPORT_GRACE_S = 10.0
"""How long an actor whose constructor raised waits for its worker's exit report."""
Actor = gcs_pb2.ActorTableData
CreateOutcome = gcs_service_pb2.CreateActorReply
CANCELLED = 19  # Ray's StatusCode::SchedulingCancelled
CREATION_TASK_ERROR = 16  # Ray's StatusCode::CreationTaskError


def copy_of(actor: gcs_pb2.ActorTableData) -> gcs_pb2.ActorTableData:
    out = Actor()
    out.CopyFrom(actor)
    return out


def ok() -> gcs_service_pb2.GcsStatus:
    return gcs_service_pb2.GcsStatus(code=0)


def created_reply(actor: gcs_pb2.ActorTableData) -> CreateOutcome:
    reply = CreateOutcome(status=ok())
    reply.actor_address.CopyFrom(actor.address)
    return reply


def cancelled_reply(actor: gcs_pb2.ActorTableData) -> CreateOutcome:
    reply = CreateOutcome(
        status=gcs_service_pb2.GcsStatus(code=CANCELLED, message="Actor creation cancelled.")
    )
    reply.death_cause.CopyFrom(actor.death_cause)
    return reply


def validated(spec: common_pb2.TaskSpec) -> bytes:
    """The actor id of a well-formed creation spec (else InvalidArgument naming the field)."""
    if spec.type != common_pb2.ACTOR_CREATION_TASK:
        raise InvalidArgument(
            f"task_spec.type must be ACTOR_CREATION_TASK, got {common_pb2.TaskType.Name(spec.type)}"
            if spec.type in common_pb2.TaskType.values()
            else f"task_spec.type: unknown value {spec.type}"
        )
    actor_id = spec.actor_creation_task_spec.actor_id
    if len(actor_id) != ACTOR_ID_SIZE:
        raise InvalidArgument(
            f"task_spec.actor_creation_task_spec.actor_id must be {ACTOR_ID_SIZE} bytes, "
            f"got {len(actor_id)}"
        )
    if spec.actor_creation_task_spec.name and not spec.actor_creation_task_spec.ray_namespace:
        raise InvalidArgument(
            "task_spec.actor_creation_task_spec.ray_namespace should be set when creating "
            "a named actor"
        )
    return actor_id


def table_data(spec: common_pb2.TaskSpec, now: int) -> gcs_pb2.ActorTableData:
    """The ActorTableData Ray builds at registration (``GcsActor``'s constructor)."""
    creation = spec.actor_creation_task_spec
    actor = Actor(
        actor_id=creation.actor_id,
        job_id=spec.job_id,
        state=states.DEPENDENCIES_UNREADY,
        max_restarts=creation.max_actor_restarts,
        is_detached=creation.is_detached,
        name=creation.name,
        ray_namespace=creation.ray_namespace,
        serialized_runtime_env=spec.runtime_env_info.serialized_runtime_env,
        timestamp=float(now),
    )
    actor.owner_address.CopyFrom(spec.caller_address)
    actor.function_descriptor.CopyFrom(spec.function_descriptor)
    actor.class_name = _class_name(spec.function_descriptor)
    actor.required_resources.update(spec.required_resources)
    strategy = spec.scheduling_strategy
    if strategy.WhichOneof("scheduling_strategy") == "placement_group_scheduling_strategy":
        actor.placement_group_id = strategy.placement_group_scheduling_strategy.placement_group_id
    if spec.HasField("call_site"):
        actor.call_site = spec.call_site
    actor.labels.update(spec.labels)
    for constraint in spec.label_selector.label_constraints:
        if constraint.label_values:
            actor.label_selector[constraint.label_key] = constraint.label_values[0]
    if spec.HasField("fallback_strategy"):
        actor.fallback_strategy.CopyFrom(spec.fallback_strategy)
    return actor


def _class_name(descriptor: common_pb2.FunctionDescriptor) -> str:
    kind = descriptor.WhichOneof("function_descriptor")
    if kind == "python_function_descriptor":
        return descriptor.python_function_descriptor.class_name
    if kind == "java_function_descriptor":
        return descriptor.java_function_descriptor.class_name
    if kind == "cpp_function_descriptor":
        return descriptor.cpp_function_descriptor.class_name
    return ""
