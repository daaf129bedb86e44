"""What every phase of the actor manager shares: the table, the lane and the write path.

:meth:`Core.update` is the one way an actor's record changes: check the transition (the
table of :mod:`~gcs.managers.actors.states`), persist it with the phase's batch, then -- only
once the store has it -- apply it in memory, run the phase's own apply step and publish on
``GCS_ACTOR``.  Callers hold the lane and re-read the table after every await.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf.message import Message

from gcs.base.background import Background
from gcs.base.clock import Clock, now_ms
from gcs.base.pubsub_channels import GCS_ACTOR_CHANNEL
from gcs.managers.actors import states
from gcs.managers.actors.records import TABLE_ACTOR
from gcs.managers.actors.table import ActorTable
from gcs.managers.lane import ApplyLane
from gcs.proto import gcs_pb2
from gcs.store import Store, WriteBatch

__all__ = ["Core", "Publish", "no_publish"]


class Publish(Protocol):
    def __call__(self, channel: int, key_id: bytes, message: Message) -> object: ...


def no_publish(channel: int, key_id: bytes, message: Message) -> None:
    return None


@dataclass(slots=True)
class Core:
    store: Store
    clock: Clock
    lane: ApplyLane
    table: ActorTable
    background: Background
    """Event work and raylet calls (tests settle it)."""
    publish: Publish
    publish_error: Publish
    """The observability publisher (``RAY_ERROR_INFO``): warnings for the job's driver."""
    job_is_dead: Callable[[bytes], bool]
    on_actor_dead: Callable[[bytes], Awaitable[object]] | None
    """Told each time an actor dies or restarts (Ray's
    ``destroy_owned_placement_group_if_needed``: the placement groups it created are removed
    once their job is dead too); runs as a task of its own, off the lane."""
    on_job_released: Callable[[bytes], Coroutine[Any, Any, object]] | None
    """Told, as a task of its own, once a job has finished and no detached actor it created
    is alive (after the last one's death): nothing can run what the job exported any more
    (Ray's ``GCSFunctionManager`` reference count reaching 0)."""

    def now_ms(self) -> int:
        return now_ms(self.clock)

    def spawn(self, work: Coroutine[Any, Any, Any], name: str = "") -> None:
        self.background.spawn(work, name)

    async def update(
        self,
        updated: gcs_pb2.ActorTableData,
        batch: WriteBatch,
        apply_more: Callable[[], None] = lambda: None,
    ) -> None:
        """Persist ``updated`` (with ``batch``), then apply it, run ``apply_more`` and
        publish.  Checks the transition first.  The lane is held by the caller."""
        actor_id = updated.actor_id
        old = self.table.actors[actor_id]
        if old.state != updated.state or updated.state == states.RESTARTING:
            states.check_transition(actor_id, old.state, updated.state)
        updated.timestamp = float(self.now_ms())
        batch.put(TABLE_ACTOR, actor_id, updated.SerializeToString())

        def apply() -> None:
            self.table.put(updated)
            apply_more()
            self.publish(GCS_ACTOR_CHANNEL, actor_id, updated)

        await self.lane.commit(batch, apply)

    def creator_dead(self, actor_id: bytes) -> None:
        if self.on_actor_dead is not None:
            self.spawn(self.on_actor_dead(actor_id), "creator-dead")  # type: ignore[arg-type]

    def release_job_if_done(self, job_id: bytes) -> None:
        if (
            self.on_job_released is not None
            and job_id not in self.table.detached_live
            and self.job_is_dead(job_id)
        ):
            self.spawn(self.on_job_released(job_id), "job-released")
