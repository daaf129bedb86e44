"""Create phase: ``CreateActor`` starts scheduling and waits; an attempt's outcome lands here.

:meth:`Creation.create` moves a registered actor to PENDING_CREATION (storing the spec with
its resolved dependencies), starts the schedule phase and answers once the actor is ALIVE or
dead.  :meth:`finish` applies an attempt's outcome on the lane: ALIVE on its worker, or
DEAD -- except when the constructor raised, where Ray's GCS lets the worker's exit report
(which carries the serialized exception) make it DEAD, falling back to the text alone after
``CREATION_EXIT_REPORT_GRACE_S`` on the injected clock.
"""

from __future__ import annotations

import asyncio

import structlog

from gcs.base.errors import FailedPrecondition
from gcs.managers.actors import states
from gcs.managers.actors.core import Core
from gcs.managers.actors.destroy import Destroyer
from gcs.managers.actors.records import (
    CREATION_EXIT_REPORT_GRACE_S,
    CREATION_TASK_ERROR,
    TABLE_ACTOR_TASK_SPEC,
    CreateOutcome,
    cancelled_reply,
    copy_of,
    created_reply,
    ok,
    validated,
)
from gcs.managers.actors.schedule import Scheduling
from gcs.managers.actors.scheduler import Created, Failed
from gcs.proto import common_pb2, gcs_service_pb2
from gcs.store import WriteBatch

__all__ = ["Creation"]

log = structlog.get_logger("gcs.actors")


class Creation:
    def __init__(self, core: Core, scheduling: Scheduling, destroyer: Destroyer) -> None:
        self._core = core
        self._scheduling = scheduling
        self._destroyer = destroyer
        self._raised: dict[bytes, bytes] = {}
        """worker id -> actor whose constructor raised there (waiting for its exit report)."""

    async def create(self, spec: common_pb2.TaskSpec) -> CreateOutcome:
        """``CreateActor``: schedule it and answer once it is ALIVE (or dead)."""
        actor_id = validated(spec)
        table = self._core.table
        async with self._core.lane:
            actor = table.actors.get(actor_id)
            if actor is None:
                raise FailedPrecondition("Actor may be already destroyed.")
            if actor.state == states.ALIVE:
                return created_reply(actor)
            if actor.state == states.DEAD:
                return cancelled_reply(actor)
            waiter: asyncio.Future[CreateOutcome] = asyncio.get_running_loop().create_future()
            table.waiters.setdefault(actor_id, []).append(waiter)
            if actor.state == states.DEPENDENCIES_UNREADY:
                updated = copy_of(actor)
                updated.state = states.PENDING_CREATION
                stored = common_pb2.TaskSpec()
                stored.CopyFrom(spec)  # the spec with resolved dependencies
                batch = WriteBatch().put(
                    TABLE_ACTOR_TASK_SPEC, actor_id, stored.SerializeToString()
                )

                def apply() -> None:
                    table.specs[actor_id] = stored
                    self._scheduling.start(actor_id)

                try:
                    await self._core.update(updated, batch, apply)
                except BaseException:
                    table.drop_waiter(actor_id, waiter)
                    raise
        try:
            return await asyncio.shield(waiter)
        except asyncio.CancelledError:
            table.drop_waiter(actor_id, waiter)
            raise

    async def finish(self, actor_id: bytes, outcome: Created | Failed) -> None:
        """An attempt's outcome, applied on the lane (the attempt is still current)."""
        if isinstance(outcome, Created):
            await self._created(actor_id, outcome)
        elif outcome.exiting_worker is not None:
            self._await_exit_report(actor_id, outcome)
        else:
            await self._destroyer.destroy(actor_id, outcome.cause)

    def take_raised(self, worker_id: bytes) -> bytes | None:
        """The actor whose constructor raised on ``worker_id``, now reported dead."""
        return self._raised.pop(worker_id, None)

    async def _created(self, actor_id: bytes, created: Created) -> None:
        actor = self._core.table.actors[actor_id]
        updated = copy_of(actor)
        updated.state = states.ALIVE
        updated.address.CopyFrom(created.worker)
        updated.node_id = created.node_id
        updated.pid = created.pid
        del updated.resource_mapping[:]
        updated.resource_mapping.extend(created.resource_mapping)
        updated.start_time = self._core.now_ms()
        if created.repr_name:
            updated.repr_name = created.repr_name
        reply = CreateOutcome(status=ok())
        reply.actor_address.CopyFrom(created.worker)
        reply.borrowed_refs.extend(created.borrowed_refs)

        def apply() -> None:
            self._core.table.by_worker[created.worker.worker_id] = actor_id
            self._core.table.resolve_waiters(actor_id, reply)

        await self._core.update(updated, WriteBatch(), apply)
        log.info("actor.alive", actor_id=actor_id.hex(), node_id=created.node_id.hex())

    def _await_exit_report(self, actor_id: bytes, failed: Failed) -> None:
        """The constructor raised: as Ray's GCS, let the worker's exit report make the actor
        DEAD; if none comes within the grace, die with the text alone."""
        assert failed.exiting_worker is not None
        worker_id = failed.exiting_worker.worker_id
        self._raised[worker_id] = actor_id
        # the creator hears now, as from Ray's GCS: status CreationTaskError with the
        # worker's error text, so its task shows TASK_EXECUTION_EXCEPTION and the
        # constructor's message (not a cancelled creation)
        reply = CreateOutcome(
            status=gcs_service_pb2.GcsStatus(code=CREATION_TASK_ERROR, message=failed.message)
        )
        reply.actor_address.CopyFrom(failed.exiting_worker)
        reply.borrowed_refs.extend(failed.borrowed_refs)
        self._core.table.resolve_waiters(actor_id, reply)
        self._core.spawn(self._exit_report_fallback(actor_id, worker_id, failed), "exit-report")

    async def _exit_report_fallback(
        self, actor_id: bytes, worker_id: bytes, failed: Failed
    ) -> None:
        await self._core.clock.sleep(CREATION_EXIT_REPORT_GRACE_S)
        async with self._core.lane:
            if self._raised.get(worker_id) != actor_id:
                return
            del self._raised[worker_id]
            actor = self._core.table.actors.get(actor_id)
            if actor is not None and actor.state != states.DEAD:
                await self._destroyer.destroy(actor_id, failed.cause, force=False)
