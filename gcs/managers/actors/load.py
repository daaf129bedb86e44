"""Start-up: reload actors and specs, repair leftovers, resume creations.

Live actors whose owner is gone are marked dead (Ray's ``OnInitializeActorShouldLoad``): one
owned by its job when that job finished, one under a detached actor when that root actor is
dead, and -- beyond Ray -- one whose owner's node is gone.  A kill -9 between a job's (or
root actor's) death and its actors' deaths leaves no actor running for nobody.  Once serving,
each raylet frees the actor workers leased before the restart that no live actor uses.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from gcs.managers.actors import states
from gcs.managers.actors.core import Core
from gcs.managers.actors.destroy import Destroyer
from gcs.managers.actors.raylet_io import ActorRayletIo
from gcs.managers.actors.records import NIL_ACTOR_ID, TABLE_ACTOR, TABLE_ACTOR_TASK_SPEC, Actor
from gcs.managers.actors.schedule import Scheduling
from gcs.proto import common_pb2, gcs_pb2

__all__ = ["Loader"]

log = structlog.get_logger("gcs.actors")


class Loader:
    def __init__(
        self,
        core: Core,
        scheduling: Scheduling,
        destroyer: Destroyer,
        io: ActorRayletIo,
        alive_nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo],
    ) -> None:
        self._core = core
        self._scheduling = scheduling
        self._destroyer = destroyer
        self._io = io
        self._alive_nodes = alive_nodes

    async def load(self) -> None:
        """Load -> repair (orphans die) -> resume the creations being scheduled."""
        table = self._core.table
        rows = await self._core.store.get_all(TABLE_ACTOR)
        specs = await self._core.store.get_all(TABLE_ACTOR_TASK_SPEC)
        for key, raw in rows.items():
            actor = Actor.FromString(raw)
            table.put(actor)
            if key in specs:
                table.specs[key] = common_pb2.TaskSpec.FromString(specs[key])
            if actor.state == states.DEAD:
                table.dead[key] = None
                continue
            table.index_live(actor)
        orphans = [
            key
            for key, actor in table.actors.items()
            if actor.state != states.DEAD and not self._owner_survives(key, actor)
        ]
        for key in sorted(table.dead, key=lambda k: table.actors[k].end_time):
            table.dead.move_to_end(key)
        async with self._core.lane:
            for actor_id in orphans:
                await self._destroyer.destroy(actor_id, states.not_loadable(table.actors[actor_id]))
        for actor_id, actor in table.actors.items():
            if actor.state in (states.PENDING_CREATION, states.RESTARTING):
                self._scheduling.start(actor_id)
        log.info("actors.loaded", live=len(table.actors) - len(table.dead), dead=len(table.dead))

    def _owner_survives(self, actor_id: bytes, actor: gcs_pb2.ActorTableData) -> bool:
        """At start-up: does what keeps ``actor`` alive still exist?"""
        table = self._core.table
        spec = table.specs.get(actor_id)
        root = spec.root_detached_actor_id if spec is not None else b""
        if not root or root == NIL_ACTOR_ID:
            root = actor_id if actor.is_detached else b""
        if root == actor_id:
            return True  # detached: it owns itself
        if root:  # under a detached actor: dies with it
            owner = table.actors.get(root)
            return owner is not None and owner.state != states.DEAD
        return not self._core.job_is_dead(actor.job_id) and (
            actor.owner_address.node_id in self._alive_nodes
        )

    async def release_unused_workers(self, node: gcs_pb2.GcsNodeInfo) -> None:
        """After a restart: the raylet frees actor workers leased before that no live actor
        uses (creations in flight are scheduled again).  Best effort, as in Ray."""
        in_use = [
            actor.address.worker_id
            for actor in self._core.table.actors.values()
            if actor.state == states.ALIVE and actor.node_id == node.node_id
        ]
        await self._io.release_unused_workers(node, in_use)
