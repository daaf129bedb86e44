"""Actors (Ray's ``GcsActorManager``): registration, creation, restarts, death, names.

State lives in memory (``actors``: every live actor and a bounded cache of dead ones) and is
written through to the ``ACTOR`` (ActorTableData) and ``ACTOR_TASK_SPEC`` (the creation
TaskSpec) tables, keyed by actor id as Ray keys them.  Every change runs on the manager's
:class:`~gcs.managers.lane.ApplyLane` (validate -> persist -> apply -> publish on
``GCS_ACTOR`` -> reply) and is checked against the transition table of
:mod:`~gcs.managers.actor_states`.

Scheduling (choose a node, lease a worker, push the creation task) is done by
:class:`~gcs.managers.actor_scheduler.ActorScheduler` in one task per attempt; its outcome is
applied on the lane only if the attempt is still the actor's current one.  Deaths arrive as
events: worker failures (:class:`~gcs.managers.events.WorkerEvents`, emitted by the worker
service), node deaths (:class:`~gcs.managers.events.NodeEvents`) and finished jobs
(:class:`~gcs.managers.events.JobEvents`); listeners are synchronous, so each event is
handled by a task of its own that takes the lane.

Restarts follow Ray 2.60: an actor whose worker or node died is restarted while restarts are
left (``max_restarts``, -1 = unlimited; restarts caused by node preemption do not count),
else it is DEAD; ``ray.kill(no_restart=True)``, its owner's death, its job finishing (unless
detached) and going out of scope make it DEAD at once.  Detached actors are reloaded after a
GCS restart; creation resumes for actors that were being scheduled.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from google.protobuf.message import Message

from gcs.background import Background
from gcs.clock import Clock, now_ms
from gcs.errors import AlreadyExists, FailedPrecondition, GcsError, InvalidArgument, NotFound
from gcs.managers import actor_states as states
from gcs.managers.actor_scheduler import ActorScheduler, Attempt, Created, Failed
from gcs.managers.actor_warnings import detached_in_anonymous_namespace
from gcs.managers.events import Prepared
from gcs.managers.lane import ApplyLane, ResolvePolicy
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2, node_manager_pb2
from gcs.pubsub.channels import GCS_ACTOR_CHANNEL, RAY_ERROR_INFO_CHANNEL
from gcs.rpc.raylets.actors import ActorGateway
from gcs.rpc.raylets.gateway import raylet_address
from gcs.store import Store, WriteBatch

__all__ = ["ACTOR_ID_SIZE", "TABLE_ACTOR", "TABLE_ACTOR_TASK_SPEC", "ActorManager", "CreateOutcome"]

log = structlog.get_logger("gcs.actors")

TABLE_ACTOR = "ACTOR"
TABLE_ACTOR_TASK_SPEC = "ACTOR_TASK_SPEC"
ACTOR_ID_SIZE = 16
_NIL_ACTOR_ID = b"\xff" * ACTOR_ID_SIZE
MAX_DEAD_CACHED = 100_000
"""Ray's ``maximum_gcs_destroyed_actor_cached_count``."""
CREATION_EXIT_REPORT_GRACE_S = 10.0
"""How long an actor whose constructor raised waits for its worker's exit report."""
Actor = gcs_pb2.ActorTableData
CreateOutcome = gcs_service_pb2.CreateActorReply
_CANCELLED = 19  # Ray's StatusCode::SchedulingCancelled
_CREATION_TASK_ERROR = 16  # Ray's StatusCode::CreationTaskError
_EXIT = common_pb2.WorkerExitType


class Publish(Protocol):
    def __call__(self, channel: int, key_id: bytes, message: Message) -> object: ...


def _no_publish(channel: int, key_id: bytes, message: Message) -> None:
    return None


def _copy(actor: gcs_pb2.ActorTableData) -> gcs_pb2.ActorTableData:
    out = Actor()
    out.CopyFrom(actor)
    return out


@dataclass(slots=True)
class _Scheduling:
    attempt: Attempt
    task: asyncio.Task[None]


class ActorManager:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        scheduler: ActorScheduler,
        gateway: ActorGateway,
        alive_nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo],
        *,
        publish: Publish = _no_publish,
        publish_error: Publish = _no_publish,
        job_is_dead: Callable[[bytes], bool] = lambda job_id: False,
        on_actor_dead: Callable[[bytes], Awaitable[object]] | None = None,
        on_job_released: Callable[[bytes], Coroutine[Any, Any, object]] | None = None,
        max_dead_cached: int = MAX_DEAD_CACHED,
        kill_timeout_s: float = 10.0,
        lane_policy: ResolvePolicy | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._scheduler = scheduler
        self._gateway = gateway
        self._alive_nodes = alive_nodes
        self._publish = publish
        self._publish_error = publish_error
        """The observability publisher (``RAY_ERROR_INFO``): warnings for the job's driver."""
        self._job_is_dead = job_is_dead
        self._on_actor_dead = on_actor_dead
        """Told each time an actor dies or restarts (Ray's
        ``destroy_owned_placement_group_if_needed``: the placement groups it created are
        removed once their job is dead too); runs as a task of its own, off the lane."""
        self._on_job_released = on_job_released
        """Told, as a task of its own, once a job has finished and no detached actor it
        created is alive (after the last one's death): nothing can run what the job
        exported any more (Ray's ``GCSFunctionManager`` reference count reaching 0)."""
        self._max_dead = max_dead_cached
        self._kill_timeout_s = kill_timeout_s
        self._lane = ApplyLane(store, "actors", clock, policy=lane_policy)
        self.actors: dict[bytes, gcs_pb2.ActorTableData] = {}
        self.specs: dict[bytes, common_pb2.TaskSpec] = {}
        self.named: dict[tuple[str, str], bytes] = {}
        """(namespace, name) -> id of the live actor holding the name."""
        self._dead: OrderedDict[bytes, None] = OrderedDict()
        self._by_worker: dict[bytes, bytes] = {}
        """worker id -> actor id, for created actors and leased creation attempts."""
        self._owned: dict[bytes, set[bytes]] = {}
        """owner worker id -> actor ids it owns (live ones)."""
        self._detached_live: dict[bytes, set[bytes]] = {}
        """job id -> the live detached actors the job created."""
        self._scheduling: dict[bytes, _Scheduling] = {}
        self._raised_in_creation: dict[bytes, bytes] = {}
        """worker id -> actor whose constructor raised there (waiting for its exit report)."""
        self._waiters: dict[bytes, list[asyncio.Future[CreateOutcome]]] = {}
        self._background = Background("actors")
        # listeners of node, job and worker events (the wiring subscribes them)
        self.node_listener = self._NodeListener(self)
        self.job_listener = self._JobListener(self)
        self.worker_listener = self._WorkerListener(self)

    # -- listeners (synchronous: each hands its work to a task that takes the lane) ------
    class _NodeListener:
        def __init__(self, manager: ActorManager) -> None:
            self._m = manager

        def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
            return None

        def on_nodes_loaded(
            self, nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo], prepared: Prepared
        ) -> None:
            return None

        def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
            self._m._spawn(self._m.on_node_dead(node))

    class _JobListener:
        def __init__(self, manager: ActorManager) -> None:
            self._m = manager

        def check_job(self, job: gcs_pb2.JobTableData) -> None:
            return None

        def on_job_finished(self, job: gcs_pb2.JobTableData) -> None:
            self._m._spawn(self._m.on_job_finished(job.job_id))

    class _WorkerListener:
        def __init__(self, manager: ActorManager) -> None:
            self._m = manager

        def on_worker_dead(self, failure: gcs_pb2.WorkerTableData) -> None:
            self._m._spawn(self._m.on_worker_dead(failure))

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        self._background.spawn(work)

    async def settle(self) -> None:
        """Until every event task spawned so far has finished (tests, shutdown)."""
        await self._background.settle()

    # -- startup -------------------------------------------------------------------------
    async def load(self) -> None:
        """Reload actors and their specs; resume creation of those being scheduled.  Live
        actors whose owner is gone are marked dead (Ray's ``OnInitializeActorShouldLoad``):
        one owned by its job when that job finished, one under a detached actor when that
        root actor is dead, and - beyond Ray - one whose owner's node is gone.  A kill -9
        between a job's (or root actor's) death and its actors' deaths leaves no actor
        running for nobody."""
        rows = await self._store.get_all(TABLE_ACTOR)
        specs = await self._store.get_all(TABLE_ACTOR_TASK_SPEC)
        orphans: list[bytes] = []
        for key, raw in rows.items():
            actor = Actor.FromString(raw)
            self.actors[key] = actor
            if key in specs:
                self.specs[key] = common_pb2.TaskSpec.FromString(specs[key])
            if actor.state == states.DEAD:
                self._dead[key] = None
                continue
            self._index_live(actor)
        for key, actor in self.actors.items():
            if actor.state != states.DEAD and not self._owner_survives(key, actor):
                orphans.append(key)
        for key in sorted(self._dead, key=lambda k: self.actors[k].end_time):
            self._dead.move_to_end(key)
        async with self._lane:
            for actor_id in orphans:
                await self._destroy(actor_id, states.not_loadable(self.actors[actor_id]))
        for actor_id, actor in self.actors.items():
            if actor.state in (states.PENDING_CREATION, states.RESTARTING):
                self._start_scheduling(actor_id)
        log.info("actors.loaded", live=len(self.actors) - len(self._dead), dead=len(self._dead))

    def _owner_survives(self, actor_id: bytes, actor: gcs_pb2.ActorTableData) -> bool:
        """At start-up: does what keeps ``actor`` alive still exist?"""
        spec = self.specs.get(actor_id)
        root = spec.root_detached_actor_id if spec is not None else b""
        if not root or root == _NIL_ACTOR_ID:
            root = actor_id if actor.is_detached else b""
        if root == actor_id:
            return True  # detached: it owns itself
        if root:  # under a detached actor: dies with it
            owner = self.actors.get(root)
            return owner is not None and owner.state != states.DEAD
        return not self._job_is_dead(actor.job_id) and (
            actor.owner_address.node_id in self._alive_nodes
        )

    async def release_unused_workers(self, node: gcs_pb2.GcsNodeInfo) -> None:
        """After a restart: the raylet frees actor workers leased before that no live actor
        uses (creations in flight are scheduled again).  Best effort, as in Ray."""
        in_use = [
            actor.address.worker_id
            for actor in self.actors.values()
            if actor.state == states.ALIVE and actor.node_id == node.node_id
        ]
        try:
            await self._gateway.release_unused_actor_workers(
                node.node_id, raylet_address(node), in_use, self._kill_timeout_s
            )
        except GcsError as err:
            log.info("actor.release_unused_failed", node_id=node.node_id.hex(), error=err.message)

    async def close(self) -> None:
        for entry in list(self._scheduling.values()):
            entry.task.cancel()
        tasks = [e.task for e in self._scheduling.values()] + self._background.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._scheduling.clear()

    async def caught_up(self) -> None:
        """Until the mutations already admitted to the lane are done (not later ones).

        Ray's GCS answers one client's requests in the order they came: ``ray.kill`` sends
        ``KillActorViaGcs`` without waiting for the reply, and the ``list_named_actors`` /
        ``get_actor`` right after it must not see the actor's name any more.  The name
        lookups call this first; when nothing is being applied it returns at once.
        """
        if self._lane.busy:
            await self._lane.run(_nothing)

    # -- queries (never wait for the lane) -----------------------------------------------
    def get(self, actor_id: bytes) -> gcs_pb2.ActorTableData | None:
        return self.actors.get(actor_id)

    def get_named(self, name: str, namespace: str) -> gcs_pb2.ActorTableData:
        actor_id = self.named.get((namespace, name))
        if actor_id is None:
            raise NotFound(f"Actor with name '{name}' was not found.")
        return self.actors[actor_id]

    def list_named(self, namespace: str, all_namespaces: bool) -> list[tuple[str, str]]:
        return sorted(key for key in self.named if all_namespaces or key[0] == namespace)

    def list_all(
        self,
        *,
        actor_id: bytes | None = None,
        job_id: bytes | None = None,
        state: int | None = None,
        limit: int | None = None,
    ) -> tuple[list[gcs_pb2.ActorTableData], int, int]:
        """(actors, total, num_filtered), as ``GetAllActorInfo`` answers.  Every actor held
        (live, and dead ones up to the cache bound), whatever ``show_dead_jobs`` says: Ray
        answers ``false`` from memory and ``true`` from its table, and ours holds both alike
        (a detached actor outlives its job and is listed after it).  Ray runs the
        ``actor_id`` filter over every actor too, so every other actor counts as filtered
        (Ray's state API takes ``total - num_filtered`` as what it should have got)."""
        out: list[gcs_pb2.ActorTableData] = []
        filtered = 0
        source: Iterable[gcs_pb2.ActorTableData] = self.actors.values()
        if actor_id is not None:
            source = filter(None, [self.actors.get(actor_id)])
            filtered = len(self.actors) - (1 if actor_id in self.actors else 0)
        for actor in source:
            if (job_id is not None and actor.job_id != job_id) or (
                state is not None and actor.state != state
            ):
                filtered += 1
                continue
            if limit is not None and len(out) >= limit:
                continue
            out.append(actor)
        return out, len(self.actors), filtered

    def count_by_state(self) -> dict[str, int]:
        counts = dict.fromkeys(Actor.ActorState.keys(), 0)
        for actor in self.actors.values():
            counts[Actor.ActorState.Name(actor.state)] += 1
        return counts

    def actors_per_node(self) -> dict[bytes, int]:
        counts: dict[bytes, int] = {}
        for actor in self.actors.values():
            if actor.state == states.ALIVE and actor.node_id:
                counts[actor.node_id] = counts.get(actor.node_id, 0) + 1
        return counts

    # -- RPC mutations -------------------------------------------------------------------
    async def register(self, spec: common_pb2.TaskSpec) -> None:
        """``RegisterActor``: a DEPENDENCIES_UNREADY actor (idempotent by actor id)."""
        actor_id = _validated(spec)
        creation = spec.actor_creation_task_spec
        async with self._lane:
            if actor_id in self.actors:
                return
            key = (creation.ray_namespace, creation.name)
            if creation.name and key in self.named:
                raise AlreadyExists(
                    f"Actor with name '{creation.name}' already exists in the namespace "
                    f"{creation.ray_namespace}"
                )
            actor = _table_data(spec, now_ms(self._clock))
            batch = (
                WriteBatch()
                .put(TABLE_ACTOR, actor_id, actor.SerializeToString())
                .put(TABLE_ACTOR_TASK_SPEC, actor_id, spec.SerializeToString())
            )
            stored = common_pb2.TaskSpec()
            stored.CopyFrom(spec)

            warning = detached_in_anonymous_namespace(actor, now_ms(self._clock))

            def apply() -> None:
                self.actors[actor_id] = actor
                self.specs[actor_id] = stored
                self._index_live(actor)
                self._publish(GCS_ACTOR_CHANNEL, actor_id, actor)
                if warning is not None:
                    self._publish_error(
                        RAY_ERROR_INFO_CHANNEL, actor.job_id.hex().encode(), warning
                    )

            await self._lane.commit(batch, apply)
            log.info("actor.registered", actor_id=actor_id.hex(), name=creation.name)

    async def create(self, spec: common_pb2.TaskSpec) -> CreateOutcome:
        """``CreateActor``: schedule it and answer once it is ALIVE (or dead)."""
        actor_id = _validated(spec)
        async with self._lane:
            actor = self.actors.get(actor_id)
            if actor is None:
                raise FailedPrecondition("Actor may be already destroyed.")
            if actor.state == states.ALIVE:
                return self._created_reply(actor)
            if actor.state == states.DEAD:
                return _cancelled_reply(actor)
            waiter: asyncio.Future[CreateOutcome] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(actor_id, []).append(waiter)
            if actor.state == states.DEPENDENCIES_UNREADY:
                updated = _copy(actor)
                updated.state = states.PENDING_CREATION
                stored = common_pb2.TaskSpec()
                stored.CopyFrom(spec)  # the spec with resolved dependencies
                batch = WriteBatch().put(
                    TABLE_ACTOR_TASK_SPEC, actor_id, stored.SerializeToString()
                )

                def apply() -> None:
                    self.specs[actor_id] = stored
                    self._start_scheduling(actor_id)

                try:
                    await self._update(updated, batch, apply)
                except BaseException:
                    self._drop_waiter(actor_id, waiter)
                    raise
        try:
            return await asyncio.shield(waiter)
        except asyncio.CancelledError:
            self._drop_waiter(actor_id, waiter)
            raise

    async def kill(self, actor_id: bytes, *, force_kill: bool, no_restart: bool) -> None:
        """``KillActorViaGcs``: no_restart -> DEAD now; else kill the worker (or the pending
        creation) and let the death restart it."""
        async with self._lane:
            actor = self.actors.get(actor_id)
            if actor is None:
                raise NotFound(f"Could not find actor with ID {actor_id.hex()}.")
            if actor.state == states.DEAD:
                return
            if no_restart:
                await self._destroy(actor_id, states.killed_by_ray_kill(actor), force=force_kill)
                return
            if actor.state == states.ALIVE:
                self._kill_worker(actor, states.killed_by_ray_kill(actor), force=force_kill)
                return
            entry = self._scheduling.get(actor_id)
            if entry is not None:  # not created yet: cancel the lease and schedule again
                self._cancel_scheduling(actor_id, states.killed_by_ray_kill(actor))
                self._start_scheduling(actor_id)

    async def report_out_of_scope(self, actor_id: bytes, lineage_restarts: int) -> None:
        async with self._lane:
            actor = self.actors.get(actor_id)
            if actor is None:
                raise NotFound(f"Could not find actor with ID {actor_id.hex()}.")
            if lineage_restarts < actor.num_restarts_due_to_lineage_reconstruction:
                log.info("actor.out_of_scope_stale", actor_id=actor_id.hex())
                return
            if actor.state == states.DEAD:
                return
            await self._destroy(actor_id, states.out_of_scope(actor), restartable=True)

    async def restart_for_lineage(self, actor_id: bytes, lineage_restarts: int) -> None:
        async with self._lane:
            actor = self.actors.get(actor_id)
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
            if actor_id not in self.specs:
                raise FailedPrecondition(f"actor {actor_id.hex()} has no creation task spec")
            updated = _copy(actor)
            updated.state = states.RESTARTING
            updated.num_restarts_due_to_lineage_reconstruction = lineage_restarts
            updated.ClearField("death_cause")
            updated.end_time = 0

            def apply() -> None:
                self._dead.pop(actor_id, None)
                self._index_live(updated)
                self._start_scheduling(actor_id)

            await self._update(updated, WriteBatch(), apply)

    # -- event handlers (each takes the lane) --------------------------------------------
    async def on_worker_dead(self, failure: gcs_pb2.WorkerTableData) -> None:
        address = failure.worker_address
        worker_id = address.worker_id
        exit_type = _EXIT.Name(failure.exit_type) if failure.HasField("exit_type") else ""
        detail = failure.exit_detail
        async with self._lane:
            for owned in sorted(self._owned.get(worker_id, ())):
                actor = self.actors[owned]
                if not actor.is_detached and actor.state != states.DEAD:
                    # Ray's words: the exit type (SYSTEM_ERROR when unset), never the
                    # owner's own exit detail
                    cause = states.owner_died(
                        actor,
                        _EXIT.Name(failure.exit_type),
                        states.OWNER_WORKER_DIED,
                        owner_ip=address.ip_address,
                    )
                    await self._destroy(owned, cause)
            actor_id = (
                self._by_worker.get(worker_id)
                or self._leased_to(worker_id)
                or self._raised_in_creation.pop(worker_id, None)
            )
            if actor_id is None:
                return
            actor = self.actors[actor_id]
            if actor.state == states.DEAD:
                return
            cause = states.worker_died(actor, exit_type or "SYSTEM_ERROR", detail)
            if failure.HasField("creation_task_exception"):
                cause = states.creation_failed(failure.creation_task_exception)
            intended = failure.HasField("exit_type") and failure.exit_type in (
                _EXIT.INTENDED_USER_EXIT,
                _EXIT.USER_ERROR,
            )
            await self._restart_or_die(actor_id, cause, reschedule=not intended)

    async def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        node_id = node.node_id
        preempted = node.death_info.reason == common_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED
        async with self._lane:
            for actor_id in sorted(self.actors):
                actor = self.actors.get(actor_id)  # a destroy above may evict dead ones
                if actor is None or actor.state == states.DEAD:
                    continue
                if actor.owner_address.node_id == node_id and not actor.is_detached:
                    cause = states.owner_died(
                        actor,
                        _EXIT.Name(_EXIT.SYSTEM_ERROR),
                        states.OWNER_NODE_DIED,
                        owner_ip=node.node_manager_address,
                    )
                    await self._destroy(actor_id, cause)
                    continue
                entry = self._scheduling.get(actor_id)
                on_node = actor.node_id == node_id and actor.state == states.ALIVE
                leasing = entry is not None and entry.attempt.node_id == node_id
                if on_node:
                    await self._restart_or_die(
                        actor_id, states.node_died(actor, node), preempted=preempted
                    )
                elif leasing:  # creation was underway there: choose again
                    self._cancel_scheduling(actor_id, None)
                    self._start_scheduling(actor_id)

    async def on_job_finished(self, job_id: bytes) -> None:
        async with self._lane:
            for actor_id in sorted(self.actors):
                actor = self.actors.get(actor_id)
                if actor is None or actor.state == states.DEAD:
                    continue
                if actor.job_id == job_id and not actor.is_detached:
                    await self._destroy(actor_id, states.owner_died(actor))
            self._release_job_if_done(job_id)

    def has_live_detached(self, job_id: bytes) -> bool:
        """A detached actor ``job_id`` created is alive (not DEAD)."""
        return job_id in self._detached_live

    def _release_job_if_done(self, job_id: bytes) -> None:
        if (
            self._on_job_released is not None
            and job_id not in self._detached_live
            and self._job_is_dead(job_id)
        ):
            self._spawn(self._on_job_released(job_id))

    # -- lane-held helpers ---------------------------------------------------------------
    async def _update(
        self,
        updated: gcs_pb2.ActorTableData,
        batch: WriteBatch,
        apply_more: Callable[[], None] = lambda: None,
    ) -> None:
        """Persist ``updated`` (with ``batch``), then apply it, run ``apply_more`` and
        publish.  Checks the transition first."""
        actor_id = updated.actor_id
        old = self.actors[actor_id]
        if old.state != updated.state or updated.state == states.RESTARTING:
            states.check_transition(actor_id, old.state, updated.state)
        updated.timestamp = float(now_ms(self._clock))
        batch.put(TABLE_ACTOR, actor_id, updated.SerializeToString())

        def apply() -> None:
            self.actors[actor_id] = updated
            apply_more()
            self._publish(GCS_ACTOR_CHANNEL, actor_id, updated)

        await self._lane.commit(batch, apply)

    async def _restart_or_die(
        self,
        actor_id: bytes,
        cause: common_pb2.ActorDeathCause,
        *,
        reschedule: bool = True,
        preempted: bool = False,
    ) -> None:
        actor = self.actors[actor_id]
        left = states.remaining_restarts(actor)
        if not reschedule or (left is not None and left <= 0 and not preempted):
            await self._destroy(actor_id, cause)
            return
        updated = _copy(actor)
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
                self._by_worker.pop(old_worker, None)
            self._cancel_scheduling(actor_id, None)
            self._start_scheduling(actor_id)

        await self._update(updated, WriteBatch(), apply)
        self._creator_dead(actor_id)  # Ray's RestartActor does it whether or not it restarts
        log.info(
            "actor.restarting",
            actor_id=actor_id.hex(),
            num_restarts=updated.num_restarts,
            remaining=left,
        )

    async def _destroy(
        self,
        actor_id: bytes,
        cause: common_pb2.ActorDeathCause,
        *,
        force: bool = True,
        restartable: bool = False,
    ) -> None:
        """DEAD now: free the name, stop creation, kill the worker, answer waiters.  The
        creation spec is kept only for an actor that lineage reconstruction may restart."""
        actor = self.actors[actor_id]
        updated = _copy(actor)
        updated.state = states.DEAD
        updated.death_cause.CopyFrom(cause)
        updated.end_time = now_ms(self._clock)
        batch = WriteBatch()
        if not restartable:
            batch.delete(TABLE_ACTOR_TASK_SPEC, actor_id)
        evicted = self._evictions()
        for old in evicted:
            batch.delete(TABLE_ACTOR, old).delete(TABLE_ACTOR_TASK_SPEC, old)

        def apply() -> None:
            self._unindex_live(actor)
            self._cancel_scheduling(actor_id, cause)
            if actor.state == states.ALIVE:
                self._kill_worker(actor, cause, force=force)
            if not restartable:
                self.specs.pop(actor_id, None)
            for old in evicted:
                self.actors.pop(old, None)
                self.specs.pop(old, None)
                self._dead.pop(old, None)
            self._dead[actor_id] = None
            for waiter in self._waiters.pop(actor_id, []):
                if not waiter.done():
                    waiter.set_result(_cancelled_reply(updated))

        await self._update(updated, batch, apply)
        self._creator_dead(actor_id)
        if actor.is_detached:
            self._release_job_if_done(actor.job_id)
        log.info(
            "actor.dead",
            actor_id=actor_id.hex(),
            reason=cause.WhichOneof("context"),
        )

    def _creator_dead(self, actor_id: bytes) -> None:
        if self._on_actor_dead is not None:
            self._background.spawn(self._on_actor_dead(actor_id))  # type: ignore[arg-type]

    def _evictions(self) -> list[bytes]:
        over = len(self._dead) + 1 - max(self._max_dead, 1)
        return list(self._dead)[:over] if over > 0 else []

    # -- scheduling ----------------------------------------------------------------------
    def _start_scheduling(self, actor_id: bytes) -> None:
        """Start (or restart) the creation of the actor's current incarnation."""
        self._cancel_scheduling(actor_id, None)
        actor = self.actors[actor_id]
        spec = self.specs[actor_id]
        attempt = Attempt(
            actor_id,
            spec,
            owner_node_id=actor.owner_address.node_id,
            actors_per_node=self.actors_per_node(),
        )
        task = asyncio.get_running_loop().create_task(
            self._schedule(attempt), name=f"actor-{actor_id.hex()}"
        )
        task.add_done_callback(_log_failure)
        self._scheduling[actor_id] = _Scheduling(attempt, task)

    def _cancel_scheduling(self, actor_id: bytes, cause: common_pb2.ActorDeathCause | None) -> None:
        entry = self._scheduling.pop(actor_id, None)
        if entry is None:
            return
        entry.task.cancel()
        attempt = entry.attempt
        worker = attempt.worker
        if worker is not None:  # leased, creation not finished: give the worker back dead
            self._by_worker.pop(worker.worker_id, None)
            self._spawn(self._kill(attempt.node_id, actor_id, worker, cause, force=True))
        elif attempt.lease_id and attempt.raylet_address:  # maybe queued at the raylet
            self._spawn(self._cancel_lease(attempt))

    async def _schedule(self, attempt: Attempt) -> None:
        actor_id = attempt.actor_id
        outcome = await self._scheduler.run(attempt)
        async with self._lane:
            entry = self._scheduling.get(actor_id)
            if entry is None or entry.attempt is not attempt:
                return  # superseded while the lane was busy
            del self._scheduling[actor_id]
            if isinstance(outcome, Failed):
                log.info("actor.creation_failed", actor_id=actor_id.hex(), why=outcome.message)
                if outcome.exiting_worker is not None:
                    self._await_exit_report(actor_id, outcome)
                    return
                await self._destroy(actor_id, outcome.cause)
                return
            await self._created(actor_id, outcome)

    def _await_exit_report(self, actor_id: bytes, failed: Failed) -> None:
        """The constructor raised: as Ray's GCS, let the worker's exit report (it carries
        the serialized exception) make the actor DEAD; if none comes within
        ``CREATION_EXIT_REPORT_GRACE_S``, die with the text alone."""
        assert failed.exiting_worker is not None
        worker_id = failed.exiting_worker.worker_id
        self._raised_in_creation[worker_id] = actor_id
        # the creator hears now, as from Ray's GCS: status CreationTaskError with the
        # worker's error text, so its task shows TASK_EXECUTION_EXCEPTION and the
        # constructor's message (not a cancelled creation)
        reply = CreateOutcome(
            status=gcs_service_pb2.GcsStatus(code=_CREATION_TASK_ERROR, message=failed.message)
        )
        reply.actor_address.CopyFrom(failed.exiting_worker)
        reply.borrowed_refs.extend(failed.borrowed_refs)
        for waiter in self._waiters.pop(actor_id, []):
            if not waiter.done():
                waiter.set_result(reply)

        async def fallback() -> None:
            await self._clock.sleep(CREATION_EXIT_REPORT_GRACE_S)
            async with self._lane:
                if self._raised_in_creation.get(worker_id) != actor_id:
                    return
                del self._raised_in_creation[worker_id]
                actor = self.actors.get(actor_id)
                if actor is not None and actor.state != states.DEAD:
                    await self._destroy(actor_id, failed.cause, force=False)

        self._spawn(fallback())

    async def _created(self, actor_id: bytes, created: Created) -> None:
        actor = self.actors[actor_id]
        updated = _copy(actor)
        updated.state = states.ALIVE
        updated.address.CopyFrom(created.worker)
        updated.node_id = created.node_id
        updated.pid = created.pid
        del updated.resource_mapping[:]
        updated.resource_mapping.extend(created.resource_mapping)
        updated.start_time = now_ms(self._clock)
        if created.repr_name:
            updated.repr_name = created.repr_name
        reply = CreateOutcome(status=_ok())
        reply.actor_address.CopyFrom(created.worker)
        reply.borrowed_refs.extend(created.borrowed_refs)

        def apply() -> None:
            self._by_worker[created.worker.worker_id] = actor_id
            for waiter in self._waiters.pop(actor_id, []):
                if not waiter.done():
                    waiter.set_result(reply)

        await self._update(updated, WriteBatch(), apply)
        log.info("actor.alive", actor_id=actor_id.hex(), node_id=created.node_id.hex())

    def _kill_worker(
        self, actor: gcs_pb2.ActorTableData, cause: common_pb2.ActorDeathCause, *, force: bool
    ) -> None:
        if actor.address.worker_id:
            self._spawn(self._kill(actor.node_id, actor.actor_id, actor.address, cause, force))

    async def _cancel_lease(self, attempt: Attempt) -> None:
        try:
            await self._gateway.cancel_worker_lease(
                attempt.node_id, attempt.raylet_address, attempt.lease_id, self._kill_timeout_s
            )
        except GcsError as err:
            log.info(
                "actor.cancel_lease_failed", actor_id=attempt.actor_id.hex(), error=err.message
            )

    async def _kill(
        self,
        node_id: bytes,
        actor_id: bytes,
        worker: common_pb2.Address,
        cause: common_pb2.ActorDeathCause | None,
        force: bool,
    ) -> None:
        """``KillLocalActor`` on the worker's raylet (best effort: a dead node kills it)."""
        node = self._alive_nodes.get(node_id or worker.node_id)
        self._gateway.forget_worker(worker)
        if node is None:
            return
        request = node_manager_pb2.KillLocalActorRequest(
            intended_actor_id=actor_id, worker_id=worker.worker_id, force_kill=force
        )
        if cause is not None:
            request.death_cause.CopyFrom(cause)
        try:
            await self._gateway.kill_local_actor(
                node.node_id, raylet_address(node), request, self._kill_timeout_s
            )
        except GcsError as err:
            log.info("actor.kill_failed", actor_id=actor_id.hex(), error=err.message)

    # -- indexes -------------------------------------------------------------------------
    def _index_live(self, actor: gcs_pb2.ActorTableData) -> None:
        if actor.name:
            self.named.setdefault((actor.ray_namespace, actor.name), actor.actor_id)
        owner = actor.owner_address.worker_id
        if owner:
            self._owned.setdefault(owner, set()).add(actor.actor_id)
        if actor.state == states.ALIVE and actor.address.worker_id:
            self._by_worker[actor.address.worker_id] = actor.actor_id
        if actor.is_detached:
            self._detached_live.setdefault(actor.job_id, set()).add(actor.actor_id)

    def _unindex_live(self, actor: gcs_pb2.ActorTableData) -> None:
        key = (actor.ray_namespace, actor.name)
        if actor.name and self.named.get(key) == actor.actor_id:
            del self.named[key]
        owned = self._owned.get(actor.owner_address.worker_id)
        if owned is not None:
            owned.discard(actor.actor_id)
            if not owned:
                del self._owned[actor.owner_address.worker_id]
        if actor.address.worker_id:
            self._by_worker.pop(actor.address.worker_id, None)
        detached = self._detached_live.get(actor.job_id)
        if detached is not None:
            detached.discard(actor.actor_id)
            if not detached:
                del self._detached_live[actor.job_id]

    def _leased_to(self, worker_id: bytes) -> bytes | None:
        """The actor whose creation task was leased ``worker_id`` (not created yet)."""
        for actor_id, entry in self._scheduling.items():
            if entry.attempt.worker is not None and entry.attempt.worker.worker_id == worker_id:
                return actor_id
        return None

    def _drop_waiter(self, actor_id: bytes, waiter: asyncio.Future[CreateOutcome]) -> None:
        waiters = self._waiters.get(actor_id)
        if waiters and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del self._waiters[actor_id]

    def _created_reply(self, actor: gcs_pb2.ActorTableData) -> CreateOutcome:
        reply = CreateOutcome(status=_ok())
        reply.actor_address.CopyFrom(actor.address)
        return reply


async def _nothing() -> None:
    return None


def _log_failure(task: asyncio.Task[None]) -> None:
    """A scheduling task that raised is a bug: say so (the actor stays where it was)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("actor.scheduling_crashed", task=task.get_name(), error=repr(task.exception()))


def _ok() -> gcs_service_pb2.GcsStatus:
    return gcs_service_pb2.GcsStatus(code=0)


def _cancelled_reply(actor: gcs_pb2.ActorTableData) -> CreateOutcome:
    reply = CreateOutcome(
        status=gcs_service_pb2.GcsStatus(code=_CANCELLED, message="Actor creation cancelled.")
    )
    reply.death_cause.CopyFrom(actor.death_cause)
    return reply


def _validated(spec: common_pb2.TaskSpec) -> bytes:
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


def _table_data(spec: common_pb2.TaskSpec, now: int) -> gcs_pb2.ActorTableData:
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
