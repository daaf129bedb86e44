"""Actors (Ray's ``GcsActorManager``): one lifecycle, split by phase over one shared table.

State lives in memory (:class:`~gcs.managers.actors.table.ActorTable`: every live actor and
a bounded cache of dead ones) and is written through to the ``ACTOR`` (ActorTableData) and
``ACTOR_TASK_SPEC`` (the creation TaskSpec) tables, keyed by actor id as Ray keys them.  Every
change runs on the manager's :class:`~gcs.managers.lane.ApplyLane` (validate -> persist ->
apply -> publish on ``GCS_ACTOR`` -> reply, :meth:`~gcs.managers.actors.core.Core.update`)
and is checked against the transition table of :mod:`~gcs.managers.actors.states`.

The phases, each a small part over the same table (as Karpenter's lifecycle controller runs
launch / registration / initialization / liveness sub-reconcilers over one object):

* :mod:`~.register` -- ``RegisterActor``;
* :mod:`~.create` -- ``CreateActor`` and an attempt's outcome (ALIVE, or DEAD);
* :mod:`~.schedule` -- one creation attempt per incarnation, off the lane
  (:mod:`~.scheduler` leases and pushes; :mod:`~.placement` chooses the node);
* :mod:`~.restart` -- a worker or node died: restart or die; lineage reconstruction;
* :mod:`~.destroy` -- DEAD: ``KillActorViaGcs``, out of scope, a finished job;
* :mod:`~.load` -- start-up: reload, orphans die, creations resume;
* :mod:`~.view` -- read-only queries (copies, never the records themselves).

Deaths arrive as events: worker failures (:class:`~gcs.managers.events.WorkerEvents`), node
deaths (:class:`~gcs.managers.events.NodeEvents`) and finished jobs
(:class:`~gcs.managers.events.JobEvents`); listeners are synchronous, so each event is
handled by a task of its own (:class:`~gcs.base.background.Background`) that takes the lane.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping, MutableSequence
from typing import Any

from gcs.base.background import Background
from gcs.base.clock import Clock
from gcs.managers.actors.core import Core, Publish, no_publish
from gcs.managers.actors.create import Creation
from gcs.managers.actors.destroy import Destroyer
from gcs.managers.actors.load import Loader
from gcs.managers.actors.raylet_io import ActorRayletIo
from gcs.managers.actors.records import MAX_DEAD_CACHED, CreateOutcome
from gcs.managers.actors.register import Registration
from gcs.managers.actors.restart import Restarts
from gcs.managers.actors.schedule import Scheduling
from gcs.managers.actors.scheduler import ActorScheduler, Created, Failed
from gcs.managers.actors.table import ActorTable
from gcs.managers.actors.view import ActorView
from gcs.managers.events import NodeDeathListener
from gcs.managers.lane import ApplyLane, ResolvePolicy
from gcs.proto import common_pb2, gcs_pb2
from gcs.rpc.raylet_io.actors import ActorGateway
from gcs.store import Store

__all__ = ["ActorManager"]


class ActorManager:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        scheduler: ActorScheduler,
        gateway: ActorGateway,
        alive_nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo],
        *,
        publish: Publish = no_publish,
        publish_error: Publish = no_publish,
        job_is_dead: Callable[[bytes], bool] = lambda job_id: False,
        on_actor_dead: Callable[[bytes], Awaitable[object]] | None = None,
        on_job_released: Callable[[bytes], Coroutine[Any, Any, object]] | None = None,
        max_dead_cached: int = MAX_DEAD_CACHED,
        kill_timeout_s: float = 10.0,
        lane_policy: ResolvePolicy | None = None,
    ) -> None:
        table = ActorTable(max_dead_cached)
        core = Core(
            store,
            clock,
            ApplyLane(store, "actors", clock, policy=lane_policy),
            table,
            Background("actors"),
            publish,
            publish_error,
            job_is_dead,
            on_actor_dead,
            on_job_released,
        )
        self._core = core
        io = ActorRayletIo(gateway, alive_nodes, kill_timeout_s)
        self._scheduling = Scheduling(core, scheduler, io, self._finish_attempt)
        self._destroy = Destroyer(core, self._scheduling, io)
        self._create = Creation(core, self._scheduling, self._destroy)
        self._restart = Restarts(core, self._scheduling, self._destroy, self._create)
        self._register = Registration(core)
        self._load = Loader(core, self._scheduling, self._destroy, io, alive_nodes)
        self.view = ActorView(table)
        """Read-only queries (copies)."""
        # listeners of node, job and worker events (the wiring subscribes them)
        self.node_listener = _NodeListener(self)
        self.job_listener = _JobListener(self)
        self.worker_listener = _WorkerListener(self)

    async def _finish_attempt(self, actor_id: bytes, outcome: Created | Failed) -> None:
        await self._create.finish(actor_id, outcome)

    def spawn(self, work: Coroutine[Any, Any, Any], name: str = "") -> None:
        """Event work, as a task of its own (settled by :meth:`settle`)."""
        self._core.spawn(work, name)

    # -- lifecycle -----------------------------------------------------------------------
    async def load(self) -> None:
        await self._load.load()

    async def release_unused_workers(self, node: gcs_pb2.GcsNodeInfo) -> None:
        await self._load.release_unused_workers(node)

    async def settle(self) -> None:
        """Until every event task spawned so far has finished (tests, shutdown)."""
        await self._core.background.settle()

    async def close(self) -> None:
        await self._scheduling.close()
        await self._core.background.close()

    async def caught_up(self) -> None:
        """Until the mutations already admitted to the lane are done (not later ones).

        Ray's GCS answers one client's requests in the order they came: ``ray.kill`` sends
        ``KillActorViaGcs`` without waiting for the reply, and the ``list_named_actors`` /
        ``get_actor`` right after it must not see the actor's name any more.  The name
        lookups call this first; when nothing is being applied it returns at once.
        """
        if self._core.lane.busy:
            await self._core.lane.run(_nothing)

    # -- queries (never wait for the lane; copies) ---------------------------------------
    def get(self, actor_id: bytes) -> gcs_pb2.ActorTableData | None:
        return self.view.get(actor_id)

    def spec_of(self, actor_id: bytes) -> common_pb2.TaskSpec | None:
        return self.view.spec_of(actor_id)

    def get_named(self, name: str, namespace: str) -> gcs_pb2.ActorTableData:
        return self.view.get_named(name, namespace)

    def list_named(self, namespace: str, all_namespaces: bool) -> list[tuple[str, str]]:
        return self.view.list_named(namespace, all_namespaces)

    def list_all(
        self,
        *,
        actor_id: bytes | None = None,
        job_id: bytes | None = None,
        state: int | None = None,
        limit: int | None = None,
        into: MutableSequence[gcs_pb2.ActorTableData] | None = None,
    ) -> tuple[list[gcs_pb2.ActorTableData], int, int]:
        return self.view.list_all(
            actor_id=actor_id, job_id=job_id, state=state, limit=limit, into=into
        )

    def count_by_state(self) -> dict[str, int]:
        return self.view.count_by_state()

    def count_by_state_and_class(self) -> Counter[tuple[int, str]]:
        return self.view.count_by_state_and_class()

    def actors_per_node(self) -> dict[bytes, int]:
        return self.view.actors_per_node()

    def has_live_detached(self, job_id: bytes) -> bool:
        return self.view.has_live_detached(job_id)

    # -- RPC mutations (each takes the lane) ---------------------------------------------
    async def register(self, spec: common_pb2.TaskSpec) -> None:
        await self._register.register(spec)

    async def create(self, spec: common_pb2.TaskSpec) -> CreateOutcome:
        return await self._create.create(spec)

    async def kill(self, actor_id: bytes, *, force_kill: bool, no_restart: bool) -> None:
        await self._destroy.kill(actor_id, force_kill=force_kill, no_restart=no_restart)

    async def report_out_of_scope(self, actor_id: bytes, lineage_restarts: int) -> None:
        await self._destroy.report_out_of_scope(actor_id, lineage_restarts)

    async def restart_for_lineage(self, actor_id: bytes, lineage_restarts: int) -> None:
        await self._restart.restart_for_lineage(actor_id, lineage_restarts)

    # -- event handlers (each takes the lane) --------------------------------------------
    async def on_worker_dead(self, failure: gcs_pb2.WorkerTableData) -> None:
        await self._restart.on_worker_dead(failure)

    async def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        await self._restart.on_node_dead(node)

    async def on_job_finished(self, job_id: bytes) -> None:
        await self._destroy.on_job_finished(job_id)


# -- listeners (synchronous: each hands its work to a task that takes the lane) ----------
class _NodeListener(NodeDeathListener):
    def __init__(self, manager: ActorManager) -> None:
        self._m = manager

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        self._m.spawn(self._m.on_node_dead(node), "node-dead")


class _JobListener:
    def __init__(self, manager: ActorManager) -> None:
        self._m = manager

    def check_job(self, job: gcs_pb2.JobTableData) -> None:
        return None

    def on_job_finished(self, job: gcs_pb2.JobTableData) -> None:
        self._m.spawn(self._m.on_job_finished(job.job_id), "job-finished")


class _WorkerListener:
    def __init__(self, manager: ActorManager) -> None:
        self._m = manager

    def on_worker_dead(self, failure: gcs_pb2.WorkerTableData) -> None:
        self._m.spawn(self._m.on_worker_dead(failure), "worker-dead")


async def _nothing() -> None:
    return None
