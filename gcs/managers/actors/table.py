"""The actors held in memory and their indexes: the state every phase shares.

Private to the package: phases change it only inside an apply step on the manager's lane;
everyone else reads it through :class:`~gcs.managers.actors.view.ActorView` (copies).
Holds every live actor and a bounded cache of dead ones (oldest evicted first), the creation
specs, and indexes over the live ones: names, owners, workers, a job's detached actors.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from gcs.managers.actors import states
from gcs.managers.actors.records import CreateOutcome
from gcs.proto import common_pb2, gcs_pb2

__all__ = ["ActorTable"]


class ActorTable:
    def __init__(self, max_dead: int) -> None:
        self.max_dead = max_dead
        self.actors: dict[bytes, gcs_pb2.ActorTableData] = {}
        self.specs: dict[bytes, common_pb2.TaskSpec] = {}
        self.named: dict[tuple[str, str], bytes] = {}
        """(namespace, name) -> id of the live actor holding the name."""
        self.dead: OrderedDict[bytes, None] = OrderedDict()
        """Dead actors held, oldest first (evicted beyond ``max_dead``)."""
        self.by_worker: dict[bytes, bytes] = {}
        """worker id -> actor id, for created actors."""
        self.owned: dict[bytes, set[bytes]] = {}
        """owner worker id -> actor ids it owns (live ones)."""
        self.detached_live: dict[bytes, set[bytes]] = {}
        """job id -> the live detached actors the job created."""
        self.waiters: dict[bytes, list[asyncio.Future[CreateOutcome]]] = {}
        """actor id -> ``CreateActor`` calls waiting for it to be ALIVE (or dead)."""
        self._alive_on: dict[bytes, int] = {}
        """node id -> ALIVE actors on it, kept as actors are put (a creation reads it: a
        scan of every actor held made each creation cost as many steps as actors held)."""

    def put(self, actor: gcs_pb2.ActorTableData) -> None:
        """Hold ``actor`` (new or replacing its previous record): the one way an actor's
        record changes, so the per-node count stays true."""
        old = self.actors.get(actor.actor_id)
        if old is not None:
            self._count(old, -1)
        self.actors[actor.actor_id] = actor
        self._count(actor, 1)

    def _count(self, actor: gcs_pb2.ActorTableData, step: int) -> None:
        if actor.state != states.ALIVE or not actor.node_id:
            return
        left = self._alive_on.get(actor.node_id, 0) + step
        if left:
            self._alive_on[actor.node_id] = left
        else:
            self._alive_on.pop(actor.node_id, None)

    def index_live(self, actor: gcs_pb2.ActorTableData) -> None:
        if actor.name:
            self.named.setdefault((actor.ray_namespace, actor.name), actor.actor_id)
        owner = actor.owner_address.worker_id
        if owner:
            self.owned.setdefault(owner, set()).add(actor.actor_id)
        if actor.state == states.ALIVE and actor.address.worker_id:
            self.by_worker[actor.address.worker_id] = actor.actor_id
        if actor.is_detached:
            self.detached_live.setdefault(actor.job_id, set()).add(actor.actor_id)

    def unindex_live(self, actor: gcs_pb2.ActorTableData) -> None:
        key = (actor.ray_namespace, actor.name)
        if actor.name and self.named.get(key) == actor.actor_id:
            del self.named[key]
        owned = self.owned.get(actor.owner_address.worker_id)
        if owned is not None:
            owned.discard(actor.actor_id)
            if not owned:
                del self.owned[actor.owner_address.worker_id]
        if actor.address.worker_id:
            self.by_worker.pop(actor.address.worker_id, None)
        detached = self.detached_live.get(actor.job_id)
        if detached is not None:
            detached.discard(actor.actor_id)
            if not detached:
                del self.detached_live[actor.job_id]

    def evictions(self) -> list[bytes]:
        """The dead actors to drop so that one more fits under the bound."""
        over = len(self.dead) + 1 - max(self.max_dead, 1)
        return list(self.dead)[:over] if over > 0 else []

    def evict(self, actor_ids: list[bytes]) -> None:
        for old in actor_ids:
            gone = self.actors.pop(old, None)
            if gone is not None:
                self._count(gone, -1)
            self.specs.pop(old, None)
            self.dead.pop(old, None)

    def actors_per_node(self) -> dict[bytes, int]:
        """node id -> its ALIVE actors (a copy)."""
        return dict(self._alive_on)

    def resolve_waiters(self, actor_id: bytes, reply: CreateOutcome) -> None:
        """Answer every ``CreateActor`` waiting for ``actor_id``."""
        for waiter in self.waiters.pop(actor_id, []):
            if not waiter.done():
                waiter.set_result(reply)

    def drop_waiter(self, actor_id: bytes, waiter: asyncio.Future[CreateOutcome]) -> None:
        waiters = self.waiters.get(actor_id)
        if waiters and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del self.waiters[actor_id]
