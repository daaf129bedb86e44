"""Register phase: ``RegisterActor`` records a DEPENDENCIES_UNREADY actor and its spec.

Idempotent by actor id; a name already held in the namespace is AlreadyExists.  A named
detached actor in an anonymous namespace also warns its job's driver
(:mod:`~gcs.managers.actors.driver_warnings`).
"""

from __future__ import annotations

import structlog

from gcs.base.errors import AlreadyExists
from gcs.base.pubsub_channels import GCS_ACTOR_CHANNEL, RAY_ERROR_INFO_CHANNEL
from gcs.managers.actors.core import Core
from gcs.managers.actors.driver_warnings import detached_in_anonymous_namespace
from gcs.managers.actors.records import (
    TABLE_ACTOR,
    TABLE_ACTOR_TASK_SPEC,
    table_data,
    validated,
)
from gcs.proto import common_pb2
from gcs.store import WriteBatch

__all__ = ["Registration"]

log = structlog.get_logger("gcs.actors")


class Registration:
    def __init__(self, core: Core) -> None:
        self._core = core

    async def register(self, spec: common_pb2.TaskSpec) -> None:
        """``RegisterActor``: a DEPENDENCIES_UNREADY actor (idempotent by actor id)."""
        actor_id = validated(spec)
        creation = spec.actor_creation_task_spec
        core, table = self._core, self._core.table
        async with core.lane:
            if actor_id in table.actors:
                return
            key = (creation.ray_namespace, creation.name)
            if creation.name and key in table.named:
                raise AlreadyExists(
                    f"Actor with name '{creation.name}' already exists in the namespace "
                    f"{creation.ray_namespace}"
                )
            actor = table_data(spec, core.now_ms())
            batch = (
                WriteBatch()
                .put(TABLE_ACTOR, actor_id, actor.SerializeToString())
                .put(TABLE_ACTOR_TASK_SPEC, actor_id, spec.SerializeToString())
            )
            stored = common_pb2.TaskSpec()
            stored.CopyFrom(spec)
            warning = detached_in_anonymous_namespace(actor, core.now_ms())

            def apply() -> None:
                table.put(actor)
                table.specs[actor_id] = stored
                table.index_live(actor)
                core.publish(GCS_ACTOR_CHANNEL, actor_id, actor)
                if warning is not None:
                    core.publish_error(RAY_ERROR_INFO_CHANNEL, actor.job_id.hex().encode(), warning)

            await core.lane.commit(batch, apply)
            log.info("actor.registered", actor_id=actor_id.hex(), name=creation.name)
