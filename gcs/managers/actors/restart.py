"""Restart phase: a worker or node died under an actor -- restart it, or let it die.

Ray 2.60's rule: an actor whose worker or node died is RESTARTING while restarts are left
(``max_restarts``, -1 = unlimited; restarts caused by node preemption do not count), else it
is DEAD; an intended exit never restarts.  Actors owned by the dead worker (or by a worker
on the dead node) die with their owner unless detached.  Lineage reconstruction restarts an
out-of-scope dead actor (``RestartActorForLineageReconstruction``).
"""

from __future__ import annotations

import structlog

from gcs.base.errors import FailedPrecondition, NotFound
from gcs.managers.actors import states
from gcs.managers.actors.core import Core
from gcs.managers.actors.create import Creation
from gcs.managers.actors.destroy import Destroyer
from gcs.managers.actors.records import Actor, copy_of
from gcs.managers.actors.schedule import Scheduling
from gcs.proto import common_pb2, gcs_pb2
from gcs.store import WriteBatch

__all__ = ["Restarts"]

log = structlog.get_logger("gcs.actors")
_EXIT = common_pb2.WorkerExitType


class Restarts:
    def __init__(
        self, core: Core, scheduling: Scheduling, destroyer: Destroyer, creation: Creation
    ) -> None:
        self._core = core
        self._scheduling = scheduling
        self._destroyer = destroyer
        self._creation = creation

    async def on_worker_dead(self, failure: gcs_pb2.WorkerTableData) -> None:
        address = failure.worker_address
        worker_id = address.worker_id
        exit_type = _EXIT.Name(failure.exit_type) if failure.HasField("exit_type") else ""
        table = self._core.table
        async with self._core.lane:
            for owned in sorted(table.owned.get(worker_id, ())):
                actor = table.actors.get(owned)  # re-read: a destroy above awaited
                if actor is not None and not actor.is_detached and actor.state != states.DEAD:
                    # Ray's words: the exit type (SYSTEM_ERROR when unset), never the
                    # owner's own exit detail
                    cause = states.owner_died(
                        actor,
                        _EXIT.Name(failure.exit_type),
                        states.OWNER_WORKER_DIED,
                        owner_ip=address.ip_address,
                    )
                    await self._destroyer.destroy(owned, cause)
            actor_id = (
                table.by_worker.get(worker_id)
                or self._scheduling.leased_to(worker_id)
                or self._creation.take_raised(worker_id)
            )
            if actor_id is None:
                return
            actor = table.actors.get(actor_id)
            if actor is None or actor.state == states.DEAD:
                return
            cause = states.worker_died(actor, exit_type or "SYSTEM_ERROR", failure.exit_detail)
            if failure.HasField("creation_task_exception"):
                cause = states.creation_failed(failure.creation_task_exception)
            intended = failure.HasField("exit_type") and failure.exit_type in (
                _EXIT.INTENDED_USER_EXIT,
                _EXIT.USER_ERROR,
            )
            await self.restart_or_die(actor_id, cause, reschedule=not intended)

    async def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        node_id = node.node_id
        preempted = node.death_info.reason == common_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED
        table = self._core.table
        async with self._core.lane:
            for actor_id in sorted(table.actors):
                actor = table.actors.get(actor_id)  # a destroy above may evict dead ones
                if actor is None or actor.state == states.DEAD:
                    continue
                if actor.owner_address.node_id == node_id and not actor.is_detached:
                    cause = states.owner_died(
                        actor,
                        _EXIT.Name(_EXIT.SYSTEM_ERROR),
                        states.OWNER_NODE_DIED,
                        owner_ip=node.node_manager_address,
                    )
                    await self._destroyer.destroy(actor_id, cause)
                    continue
                if actor.node_id == node_id and actor.state == states.ALIVE:
                    await self.restart_or_die(
                        actor_id, states.node_died(actor, node), preempted=preempted
                    )
                elif self._scheduling.on_node(actor_id, node_id):  # creation underway there
                    self._scheduling.restart(actor_id)

    async def restart_for_lineage(self, actor_id: bytes, lineage_restarts: int) -> None:
        table = self._core.table
        async with self._core.lane:
            actor = table.actors.get(actor_id)
            if actor is None:
                raise NotFound(f"Could not find actor with ID {actor_id.hex()}.")
            current = actor.num_restarts_due_to_lineage_reconstruction
            if lineage_restarts <= current:
                log.info("actor.lineage_restart_stale", actor_id=actor_id.hex(), current=current)
                return
            reason = actor.death_cause.actor_died_error_context.reason
            if actor.state != states.DEAD or reason != states.Reason.OUT_OF_SCOPE:
                raise FailedPrecondition(
                    f"actor {actor_id.hex()} is not an out-of-scope dead actor "
                    f"({Actor.ActorState.Name(actor.state)})"
                )
            if actor_id not in table.specs:
                raise FailedPrecondition(f"actor {actor_id.hex()} has no creation task spec")
            updated = copy_of(actor)
            updated.state = states.RESTARTING
            updated.num_restarts_due_to_lineage_reconstruction = lineage_restarts
            updated.ClearField("death_cause")
            updated.end_time = 0

            def apply() -> None:
                table.dead.pop(actor_id, None)
                table.index_live(updated)
                self._scheduling.start(actor_id)

            await self._core.update(updated, WriteBatch(), apply)

    async def restart_or_die(
        self,
        actor_id: bytes,
        cause: common_pb2.ActorDeathCause,
        *,
        reschedule: bool = True,
        preempted: bool = False,
    ) -> None:
        """RESTARTING (lane held) while restarts are left, else DEAD."""
        actor = self._core.table.actors[actor_id]
        left = states.remaining_restarts(actor)
        if not reschedule or (left is not None and left <= 0 and not preempted):
            await self._destroyer.destroy(actor_id, cause)
            return
        updated = copy_of(actor)
        updated.state = states.RESTARTING
        updated.num_restarts += 1
        if preempted:
            updated.num_restarts_due_to_node_preemption += 1
            updated.preempted = True
        if actor.address.worker_id:
            updated.previous_incarnations.add(
                worker_id=actor.address.worker_id, node_id=actor.node_id
            )
        updated.ClearField("address")
        updated.ClearField("node_id")
        updated.pid = 0
        updated.death_cause.CopyFrom(cause)
        old_worker = actor.address.worker_id

        def apply() -> None:
            if old_worker:
                self._core.table.by_worker.pop(old_worker, None)
            self._scheduling.restart(actor_id)

        await self._core.update(updated, WriteBatch(), apply)
        self._core.creator_dead(actor_id)  # Ray's RestartActor does it whether or not it restarts
        log.info(
            "actor.restarting",
            actor_id=actor_id.hex(),
            num_restarts=updated.num_restarts,
            remaining=left,
        )
