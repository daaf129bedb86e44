"""Destroy phase: an actor becomes DEAD, and what Ray's GCS does with it.

:meth:`Destroyer.destroy` (lane held): free the name, stop creation, kill the worker, answer
the ``CreateActor`` waiters, keep the record in the bounded dead cache (evicting the oldest),
and drop the creation spec unless lineage reconstruction may restart the actor.  The
mutations that end in it: ``KillActorViaGcs``, ``ReportActorOutOfScope`` and a finished job.
"""

from __future__ import annotations

import structlog

from gcs.base.errors import NotFound
from gcs.managers.actors import states
from gcs.managers.actors.core import Core
from gcs.managers.actors.raylet_io import ActorRayletIo
from gcs.managers.actors.records import (
    TABLE_ACTOR,
    TABLE_ACTOR_TASK_SPEC,
    cancelled_reply,
    copy_of,
)
from gcs.managers.actors.schedule import Scheduling
from gcs.proto import common_pb2, gcs_pb2
from gcs.store import WriteBatch

__all__ = ["Destroyer"]

log = structlog.get_logger("gcs.actors")


class Destroyer:
    def __init__(self, core: Core, scheduling: Scheduling, io: ActorRayletIo) -> None:
        self._core = core
        self._scheduling = scheduling
        self._io = io

    async def destroy(
        self,
        actor_id: bytes,
        cause: common_pb2.ActorDeathCause,
        *,
        force: bool = True,
        restartable: bool = False,
    ) -> None:
        """DEAD now (lane held).  The creation spec is kept only for an actor that lineage
        reconstruction may restart."""
        table = self._core.table
        actor = table.actors[actor_id]
        updated = copy_of(actor)
        updated.state = states.DEAD
        updated.death_cause.CopyFrom(cause)
        updated.end_time = self._core.now_ms()
        batch = WriteBatch()
        if not restartable:
            batch.delete(TABLE_ACTOR_TASK_SPEC, actor_id)
        evicted = table.evictions()
        for old in evicted:
            batch.delete(TABLE_ACTOR, old).delete(TABLE_ACTOR_TASK_SPEC, old)

        def apply() -> None:
            table.unindex_live(actor)
            self._scheduling.cancel(actor_id, cause)
            if actor.state == states.ALIVE:
                self.kill_worker(actor, cause, force=force)
            if not restartable:
                table.specs.pop(actor_id, None)
            table.evict(evicted)
            table.dead[actor_id] = None
            table.resolve_waiters(actor_id, cancelled_reply(updated))

        await self._core.update(updated, batch, apply)
        self._core.creator_dead(actor_id)
        if actor.is_detached:
            self._core.release_job_if_done(actor.job_id)
        log.info("actor.dead", actor_id=actor_id.hex(), reason=cause.WhichOneof("context"))

    def kill_worker(
        self, actor: gcs_pb2.ActorTableData, cause: common_pb2.ActorDeathCause, *, force: bool
    ) -> None:
        """Kill the actor's worker on its raylet, off the lane (best effort)."""
        if actor.address.worker_id:
            self._core.spawn(
                self._io.kill(actor.node_id, actor.actor_id, actor.address, cause, force), "kill"
            )

    async def kill(self, actor_id: bytes, *, force_kill: bool, no_restart: bool) -> None:
        """``KillActorViaGcs``: no_restart -> DEAD now; else kill the worker (or the pending
        creation) and let the death restart it."""
        async with self._core.lane:
            actor = self._core.table.actors.get(actor_id)
            if actor is None:
                raise NotFound(f"Could not find actor with ID {actor_id.hex()}.")
            if actor.state == states.DEAD:
                return
            cause = states.killed_by_ray_kill(actor)
            if no_restart:
                await self.destroy(actor_id, cause, force=force_kill)
                return
            if actor.state == states.ALIVE:
                self.kill_worker(actor, cause, force=force_kill)
                return
            if self._scheduling.pending(actor_id):  # not created yet: cancel, choose again
                self._scheduling.cancel(actor_id, cause)
                self._scheduling.start(actor_id)

    async def report_out_of_scope(self, actor_id: bytes, lineage_restarts: int) -> None:
        """``ReportActorOutOfScope``: DEAD, restartable by lineage reconstruction."""
        async with self._core.lane:
            actor = self._core.table.actors.get(actor_id)
            if actor is None:
                raise NotFound(f"Could not find actor with ID {actor_id.hex()}.")
            if lineage_restarts < actor.num_restarts_due_to_lineage_reconstruction:
                log.info("actor.out_of_scope_stale", actor_id=actor_id.hex())
                return
            if actor.state == states.DEAD:
                return
            await self.destroy(actor_id, states.out_of_scope(actor), restartable=True)

    async def on_job_finished(self, job_id: bytes) -> None:
        """The job's actors die with it, except detached ones."""
        table = self._core.table
        async with self._core.lane:
            for actor_id in sorted(table.actors):
                actor = table.actors.get(actor_id)  # a destroy above may evict dead ones
                if actor is None or actor.state == states.DEAD:
                    continue
                if actor.job_id == job_id and not actor.is_detached:
                    await self.destroy(actor_id, states.owner_died(actor))
            self._core.release_job_if_done(job_id)
