"""An actor manager over real node / job managers, a memory store and the fake gateway."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf.message import Message

from gcs.base.changes import Changes
from gcs.base.clock import FakeClock
from gcs.base.pubsub_channels import GCS_ACTOR_CHANNEL, RAY_ERROR_INFO_CHANNEL
from gcs.managers.actors import ActorManager
from gcs.managers.actors.cluster_view import LiveClusterView
from gcs.managers.actors.scheduler import ActorScheduler, RetryPolicy
from gcs.managers.events import JobEvents, NodeEvents, WorkerEvents
from gcs.managers.jobs import JobManager
from gcs.managers.nodes import NodeManager
from gcs.managers.resources import ResourceCache
from gcs.proto import common_pb2, gcs_pb2
from gcs.store import Store
from gcs.store.memory import MemoryStore
from gcs.testing.actors import FakeActorGateway

Actor = gcs_pb2.ActorTableData
FAST = RetryPolicy(first_backoff_s=0.001, max_backoff_s=0.01)
JOB = (1).to_bytes(4, "little")
DRIVER = b"\xd0" * 28


async def turns_until(condition: Callable[[], bool], turns: int = 10_000) -> None:
    """Let the event loop run until ``condition`` holds (no wall time involved)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def node_id(n: int) -> bytes:
    return bytes([n]) * 28


def node_info(n: int, cpus: float = 4) -> gcs_pb2.GcsNodeInfo:
    return gcs_pb2.GcsNodeInfo(
        node_id=node_id(n),
        node_manager_address="127.0.0.2",
        node_manager_port=40000 + n,
        resources_total={"CPU": cpus},
        state=gcs_pb2.GcsNodeInfo.ALIVE,
    )


def actor_spec(
    n: int,
    *,
    name: str = "",
    namespace: str = "ns",
    detached: bool = False,
    max_restarts: int = 0,
    owner_node: int = 1,
    owner: bytes = DRIVER,
    job: bytes = JOB,
    cpus: float = 1,
    strategy: common_pb2.SchedulingStrategy | None = None,
) -> common_pb2.TaskSpec:
    spec = common_pb2.TaskSpec(
        type=common_pb2.ACTOR_CREATION_TASK,
        job_id=job,
        task_id=bytes([n]) * 24,
        required_resources={"CPU": cpus} if cpus else {},
        caller_address=common_pb2.Address(
            node_id=node_id(owner_node), ip_address="127.0.0.2", port=1234, worker_id=owner
        ),
    )
    spec.function_descriptor.python_function_descriptor.class_name = f"Actor{n}"
    creation = spec.actor_creation_task_spec
    creation.actor_id = bytes([n]) * 16
    creation.max_actor_restarts = max_restarts
    creation.is_detached = detached
    creation.name = name
    creation.ray_namespace = namespace
    if strategy is not None:
        spec.scheduling_strategy.CopyFrom(strategy)
    return spec


@dataclass
class Harness:
    store: Store = field(default_factory=MemoryStore)
    clock: FakeClock = field(default_factory=FakeClock)
    gateway: FakeActorGateway = field(default_factory=FakeActorGateway)
    published: list[Actor] = field(default_factory=list)
    worker_events: WorkerEvents = field(default_factory=WorkerEvents)
    max_dead_cached: int = 100_000
    changes: Changes = field(default_factory=Changes)
    """Notified on every actor change published (what the manager applied)."""
    virtual_cluster: frozenset[bytes] | None = None
    """When set, every job runs in a virtual cluster of these nodes."""
    errors: list[tuple[bytes, gcs_pb2.ErrorTableData]] = field(default_factory=list)
    """(key, message) published on the error channel."""
    told_dead: list[bytes] = field(default_factory=list)
    """Actor ids the manager reported dead or restarting (placement-group cleanup)."""
    released_jobs: list[bytes] = field(default_factory=list)
    """Jobs the manager released: finished, and no detached actor of theirs alive."""

    def __post_init__(self) -> None:
        self.cache = ResourceCache(self.clock)
        self.node_events = NodeEvents(self.cache)
        self.job_events = JobEvents()
        self.nodes = NodeManager(self.store, self.clock, events=self.node_events)
        self.jobs = JobManager(self.store, self.clock, events=self.job_events)
        members = self.virtual_cluster
        view = LiveClusterView(
            self.nodes.alive,
            self.cache,
            {},
            job_cluster=lambda job_id: "vc" if members is not None else "",
            cluster_nodes=lambda cluster_id: members if cluster_id else None,
        )
        self.actors = ActorManager(
            self.store,
            self.clock,
            # FAST back-off of a few ms: the fake clock does not move by itself
            ActorScheduler(self.gateway, view, retry=FAST, sleep=asyncio.sleep),
            self.gateway,
            self.nodes.alive,
            publish=self._publish,
            publish_error=self._publish_error,
            on_actor_dead=self._actor_dead,
            on_job_released=self._job_released,
            job_is_dead=self._job_is_dead,
            max_dead_cached=self.max_dead_cached,
        )
        self.node_events.subscribe(self.actors.node_listener)
        self.job_events.subscribe(self.actors.job_listener)
        self.worker_events.subscribe(self.actors.worker_listener)

    def _job_is_dead(self, job_id: bytes) -> bool:
        job = self.jobs.jobs.get(job_id)
        return job is not None and job.is_dead

    def _publish(self, channel: int, key_id: bytes, message: Message) -> None:
        assert channel == GCS_ACTOR_CHANNEL
        assert isinstance(message, Actor) and key_id == message.actor_id
        self.published.append(message)
        self.changes.notify()

    async def until(self, predicate: Callable[[], object]) -> None:
        """Until ``predicate()`` holds, re-checked after every actor change published."""
        await self.changes.until(predicate)

    def _publish_error(self, channel: int, key_id: bytes, message: Message) -> None:
        assert channel == RAY_ERROR_INFO_CHANNEL and isinstance(message, gcs_pb2.ErrorTableData)
        self.errors.append((key_id, message))

    async def _actor_dead(self, actor_id: bytes) -> None:
        self.told_dead.append(actor_id)

    async def _job_released(self, job_id: bytes) -> None:
        self.released_jobs.append(job_id)

    async def start(self, *nodes: int) -> Harness:
        await self.nodes.load()
        await self.jobs.load()
        await self.actors.load()
        for n in nodes:
            await self.nodes.register(node_info(n))
        return self

    def restarted(self) -> Harness:
        """A fresh set of managers on the same store (a GCS restart)."""
        return Harness(
            store=self.store,
            clock=self.clock,
            gateway=self.gateway,
            released_jobs=self.released_jobs,
        )

    def states(self, actor_id: bytes) -> list[str]:
        return [Actor.ActorState.Name(a.state) for a in self.published if a.actor_id == actor_id]

    async def create(self, spec: common_pb2.TaskSpec) -> gcs_pb2.ActorTableData:
        await self.actors.register(spec)
        reply = await self.actors.create(spec)
        assert reply.status.code == 0, reply
        return self.actors.get(spec.actor_creation_task_spec.actor_id)

    def worker_failure(
        self,
        worker: common_pb2.Address,
        exit_type: int = common_pb2.SYSTEM_ERROR,
        detail: str = "killed",
    ) -> None:
        failure = gcs_pb2.WorkerTableData(
            worker_address=worker,
            exit_type=exit_type,
            exit_detail=detail,  # type: ignore[arg-type]
        )
        for listener in self.worker_events:
            listener.on_worker_dead(failure)
