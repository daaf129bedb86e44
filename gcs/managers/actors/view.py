"""Read-only queries over the actors held: every answer is a copy or a plain value.

Queries never wait for the lane and never hand out the manager's own records: a caller that
changes what it got changes nothing here.  ``GetAllActorInfo`` fills its reply directly
(one copy per actor, no second one in between).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, MutableSequence

from gcs.base.errors import NotFound
from gcs.managers.actors.records import Actor, copy_of
from gcs.managers.actors.table import ActorTable
from gcs.proto import common_pb2, gcs_pb2

__all__ = ["ActorView"]


class ActorView:
    def __init__(self, table: ActorTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table.actors)

    def __contains__(self, actor_id: object) -> bool:
        return actor_id in self._table.actors

    def get(self, actor_id: bytes) -> gcs_pb2.ActorTableData | None:
        """A copy of the actor's record (None: not held)."""
        actor = self._table.actors.get(actor_id)
        return copy_of(actor) if actor is not None else None

    def spec_of(self, actor_id: bytes) -> common_pb2.TaskSpec | None:
        """A copy of the actor's creation spec (None: none kept)."""
        spec = self._table.specs.get(actor_id)
        if spec is None:
            return None
        out = common_pb2.TaskSpec()
        out.CopyFrom(spec)
        return out

    def get_named(self, name: str, namespace: str) -> gcs_pb2.ActorTableData:
        actor_id = self._table.named.get((namespace, name))
        if actor_id is None:
            raise NotFound(f"Actor with name '{name}' was not found.")
        return copy_of(self._table.actors[actor_id])

    def list_named(self, namespace: str, all_namespaces: bool) -> list[tuple[str, str]]:
        return sorted(key for key in self._table.named if all_namespaces or key[0] == namespace)

    def list_all(
        self,
        *,
        actor_id: bytes | None = None,
        job_id: bytes | None = None,
        state: int | None = None,
        limit: int | None = None,
        into: MutableSequence[gcs_pb2.ActorTableData] | None = None,
    ) -> tuple[list[gcs_pb2.ActorTableData], int, int]:
        """(actors, total, num_filtered), as ``GetAllActorInfo`` answers; the actors are
        copies (appended to ``into`` when given, e.g. the reply's repeated field, and then
        returned as an empty list).  Every actor held (live, and dead ones up to the cache
        bound), whatever ``show_dead_jobs`` says: Ray answers ``false`` from memory and
        ``true`` from its table, and ours holds both alike (a detached actor outlives its
        job and is listed after it).  Ray runs the ``actor_id`` filter over every actor
        too, so every other actor counts as filtered (Ray's state API takes
        ``total - num_filtered`` as what it should have got)."""
        actors = self._table.actors
        chosen: list[gcs_pb2.ActorTableData] = []
        filtered = 0
        source: Iterable[gcs_pb2.ActorTableData] = actors.values()
        if actor_id is not None:
            source = filter(None, [actors.get(actor_id)])
            filtered = len(actors) - (1 if actor_id in actors else 0)
        for actor in source:
            if (job_id is not None and actor.job_id != job_id) or (
                state is not None and actor.state != state
            ):
                filtered += 1
                continue
            if limit is not None and len(chosen) >= limit:
                continue
            chosen.append(actor)
        if into is not None:
            into.extend(chosen)  # a repeated field copies what it is given
            return [], len(actors), filtered
        return [copy_of(actor) for actor in chosen], len(actors), filtered

    def count_by_state(self) -> dict[str, int]:
        counts = dict.fromkeys(Actor.ActorState.keys(), 0)
        for actor in self._table.actors.values():
            counts[Actor.ActorState.Name(actor.state)] += 1
        return counts

    def count_by_state_and_class(self) -> Counter[tuple[int, str]]:
        """(state, class name) -> actors held (the ``actors`` metric family)."""
        return Counter((actor.state, actor.class_name) for actor in self._table.actors.values())

    def actors_per_node(self) -> dict[bytes, int]:
        return self._table.actors_per_node()

    def has_live_detached(self, job_id: bytes) -> bool:
        """A detached actor ``job_id`` created is alive (not DEAD)."""
        return job_id in self._table.detached_live
