"""Schedule phase: one creation attempt per actor incarnation, run off the lane.

:meth:`Scheduling.start` begins an attempt (choose a node, lease, push: the
:class:`~gcs.managers.actors.scheduler.ActorScheduler`) as a task of its own, under a
:class:`~gcs.base.background.Background` with the one failure policy.  When the attempt ends its
outcome is handed to ``finish`` on the lane, and only if the attempt is still the actor's
current one (a restart, a kill or a death supersedes it while the lane was busy).
:meth:`cancel` drops an attempt: a worker already leased is killed, a lease maybe queued
at a raylet is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from gcs.base.background import Background
from gcs.managers.actors.core import Core
from gcs.managers.actors.raylet_io import ActorRayletIo
from gcs.managers.actors.scheduler import ActorScheduler, Attempt, Created, Failed
from gcs.proto import common_pb2

__all__ = ["Finish", "Scheduling"]

log = structlog.get_logger("gcs.actors")
Finish = Callable[[bytes, Created | Failed], Awaitable[None]]
"""Applies an attempt's outcome (called on the lane, the attempt still current)."""


@dataclass(slots=True)
class _Current:
    attempt: Attempt
    task: asyncio.Task[Any] | None = None


class Scheduling:
    def __init__(
        self, core: Core, scheduler: ActorScheduler, io: ActorRayletIo, finish: Finish
    ) -> None:
        self._core = core
        self._scheduler = scheduler
        self._io = io
        self._finish = finish
        self._current: dict[bytes, _Current] = {}
        self._attempts = Background("actors.scheduling")
        """Creation attempts: they may wait for a node for ever, so tests never settle them."""

    def start(self, actor_id: bytes) -> None:
        """Start (or restart) the creation of the actor's current incarnation."""
        self.cancel(actor_id, None)
        table = self._core.table
        actor = table.actors[actor_id]
        attempt = Attempt(
            actor_id,
            table.specs[actor_id],
            owner_node_id=actor.owner_address.node_id,
            actors_per_node=table.actors_per_node(),
        )
        current = _Current(attempt)
        self._current[actor_id] = current
        current.task = self._attempts.spawn(self._run(current), name=actor_id.hex())

    def cancel(self, actor_id: bytes, cause: common_pb2.ActorDeathCause | None) -> None:
        """Drop the actor's attempt, if any: its task ends, its worker or lease goes back."""
        current = self._current.pop(actor_id, None)
        if current is None:
            return
        if current.task is not None:
            current.task.cancel()
        attempt = current.attempt
        worker = attempt.worker
        if worker is not None:  # leased, creation not finished: give the worker back dead
            self._core.table.by_worker.pop(worker.worker_id, None)
            self._core.spawn(
                self._io.kill(attempt.node_id, actor_id, worker, cause, force=True), "kill"
            )
        elif attempt.lease_id and attempt.raylet_address:  # maybe queued at the raylet
            self._core.spawn(self._io.cancel_lease(attempt), "cancel-lease")

    def restart(self, actor_id: bytes) -> None:
        """Drop the current attempt and choose again (its node died, ray.kill)."""
        self.cancel(actor_id, None)
        self.start(actor_id)

    def pending(self, actor_id: bytes) -> bool:
        return actor_id in self._current

    def on_node(self, actor_id: bytes, node_id: bytes) -> bool:
        """The actor's current attempt is asking (or was granted by) ``node_id``."""
        current = self._current.get(actor_id)
        return current is not None and current.attempt.node_id == node_id

    def leased_to(self, worker_id: bytes) -> bytes | None:
        """The actor whose creation task was leased ``worker_id`` (not created yet)."""
        for actor_id, current in self._current.items():
            worker = current.attempt.worker
            if worker is not None and worker.worker_id == worker_id:
                return actor_id
        return None

    async def close(self) -> None:
        self._current.clear()
        await self._attempts.close()

    async def _run(self, current: _Current) -> None:
        outcome = await self._scheduler.run(current.attempt)
        actor_id = current.attempt.actor_id
        async with self._core.lane:
            if self._current.get(actor_id) is not current:
                return  # superseded while the lane was busy
            del self._current[actor_id]
            if isinstance(outcome, Failed):
                log.info("actor.creation_failed", actor_id=actor_id.hex(), why=outcome.message)
            await self._finish(actor_id, outcome)
