"""The managers of one GCS and the raylet I/O they use, built with no I/O (see
:mod:`gcs.server.wiring`, which subscribes their listeners and runs them as components).

One builder per area, each a table of constructor calls: the raylet gateways, the state
owners (KV, nodes, jobs, placement groups, virtual clusters), what reaches raylets about
resources, and the work owners (workers, tasks, runtime envs, actors).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gcs.base.clock import Clock
from gcs.base.pubsub_channels import RAY_VIRTUAL_CLUSTER_CHANNEL
from gcs.config import GcsConfig, LoadPollConfig
from gcs.managers.actors import ActorManager
from gcs.managers.actors.cluster_view import LiveClusterView
from gcs.managers.actors.scheduler import ActorScheduler
from gcs.managers.autoscaler_state import AutoscalerStateManager
from gcs.managers.cluster_meta import ClusterIdentity
from gcs.managers.events import JobEvents, NodeEvents, PlacementGroupEvents, WorkerEvents
from gcs.managers.health import HealthChecker
from gcs.managers.job_release import JobRelease, held_by_job_or_actors, kv_package_deleter
from gcs.managers.job_view import JobView
from gcs.managers.jobs import JobManager
from gcs.managers.kv import KvManager
from gcs.managers.lane import ResolvePolicy
from gcs.managers.load_poller import LoadPoller
from gcs.managers.nodes import NodeManager
from gcs.managers.pg_scheduler import PlacementConfig, PlacementGroupScheduler
from gcs.managers.placement_groups import PlacementGroupManager
from gcs.managers.pubsub.config import PublisherConfig
from gcs.managers.resources import ResourceCache
from gcs.managers.runtime_env import RuntimeEnvPins
from gcs.managers.sync_hub import SyncHub
from gcs.managers.task_failures import TaskFailureMarker
from gcs.managers.tasks import TaskEventStore
from gcs.managers.virtual_clusters import VirtualClusterManager
from gcs.managers.workers import WorkerManager
from gcs.rpc.drivers import GrpcDriverGateway
from gcs.rpc.raylet_io.actors import ActorGateway, GrpcActorGateway
from gcs.rpc.raylet_io.budget import budget_for, nofile_soft_limit
from gcs.rpc.raylet_io.gateway import RayletGateway
from gcs.rpc.raylet_io.grpc_gateway import GrpcRayletGateway
from gcs.rpc.raylet_io.pool import RayletClientPool
from gcs.rpc.security import Security
from gcs.server.extras import Extras, launchable_of
from gcs.server.managers import Managers
from gcs.services.pubsub_runtime import GcsPubSub
from gcs.store.metered import MeteredStore

__all__ = ["ActorIo", "BuiltManagers", "Context", "Events", "RayletIo", "build_managers"]


@dataclass(frozen=True, slots=True)
class BuiltManagers:
    managers: Managers
    identity: ClusterIdentity
    task_failures: TaskFailureMarker
    """A job and worker listener the servicers do not reach (not in ``managers``)."""
    io: RayletIo


def build_managers(
    ctx: Context,
    events: Events,
    extras: Extras,
    raylets: RayletGateway | None,
    actor_gateway: ActorGateway | None,
) -> BuiltManagers:
    """Every manager, in dependency order (``raylets`` / ``actor_gateway``: fakes in tests)."""
    io = _raylet_io(ctx, raylets, actor_gateway)
    state = _state_managers(ctx, io, events, extras)
    reach = _placement_and_load(ctx, io, state)
    work = _work_managers(ctx, io, events, state)
    managers = _assemble(ctx, io, state, reach, work, events)
    return BuiltManagers(managers, state.identity, work.task_failures, io)


# -- what the builders share and return ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Context:
    cfg: GcsConfig
    store: MeteredStore
    """The store as the managers see it (metered)."""
    clock: Clock
    security: Security
    lane_policy: ResolvePolicy | None


@dataclass(frozen=True, slots=True)
class Events:
    node: NodeEvents
    job: JobEvents
    pg: PlacementGroupEvents
    worker: WorkerEvents


@dataclass(frozen=True, slots=True)
class RayletIo:
    raylets: RayletGateway
    actors: ActorIo
    load_poll: LoadPollConfig
    timeout_s: float


@dataclass(frozen=True, slots=True)
class _State:
    kv: KvManager
    identity: ClusterIdentity
    pubsub: GcsPubSub
    cache: ResourceCache
    nodes: NodeManager
    health: HealthChecker
    jobs: JobManager
    pgs: PlacementGroupManager
    virtual_clusters: VirtualClusterManager


@dataclass(frozen=True, slots=True)
class _Reach:
    pg_scheduler: PlacementGroupScheduler
    autoscaler: AutoscalerStateManager
    syncer: SyncHub
    poller: LoadPoller


@dataclass(frozen=True, slots=True)
class _Work:
    workers: WorkerManager
    tasks: TaskEventStore
    task_failures: TaskFailureMarker
    runtime_envs: RuntimeEnvPins
    actors: ActorManager


# -- raylet I/O --------------------------------------------------------------------------------
def _raylet_io(
    ctx: Context, raylets: RayletGateway | None, actor_gateway: ActorGateway | None
) -> RayletIo:
    cfg = ctx.cfg
    load_poll = cfg.load_poll
    if ctx.security.tls is not None and load_poll.transport == "h2":
        load_poll = dataclasses.replace(load_poll, transport="grpc")  # h2 client: no TLS
    if raylets is None:
        raylets = GrpcRayletGateway(
            budget_for(cfg.raylet_io, nofile_soft_limit()),
            poll_transport=load_poll.transport,
            security=ctx.security,
            clock=ctx.clock,
        )
    actor_io = _actor_io(raylets, actor_gateway, ctx.security)
    return RayletIo(raylets, actor_io, load_poll, cfg.raylet_rpc_timeout_ms / 1000)


@dataclass(slots=True)
class ActorIo:
    gateway: ActorGateway
    owned: list[Callable[[], Awaitable[None]]]

    async def close(self) -> None:
        for close in self.owned:
            await close()


def _actor_io(raylets: RayletGateway, given: ActorGateway | None, security: Security) -> ActorIo:
    """The actor gateway: given (tests), or over the raylet gateway's client pool (a raylet
    gateway given by the caller: actor calls get a pool of their own)."""
    if given is not None:
        return ActorIo(given, [])
    if isinstance(raylets, GrpcRayletGateway):
        gateway = GrpcActorGateway(raylets.pool, security=security, gateway=raylets)
        return ActorIo(gateway, [gateway.close])
    pool = RayletClientPool(64, security)
    owned = [pool.close]
    gateway = GrpcActorGateway(pool, security=security)
    return ActorIo(gateway, [gateway.close, *owned])


# -- managers ----------------------------------------------------------------------------------
def _state_managers(ctx: Context, io: RayletIo, events: Events, extras: Extras) -> _State:
    """The state owners of the cluster: KV, identity, nodes, jobs, placement groups and
    virtual clusters (with pubsub, the resource cache and the health checker they need)."""
    cfg, store, clock, lanes = ctx.cfg, ctx.store, ctx.clock, ctx.lane_policy
    kv = KvManager(store)
    identity = ClusterIdentity(
        store, kv, session_name=cfg.session_name, python_version=cfg.python_version
    )
    pubsub = GcsPubSub.create(
        clock,
        control_plane=PublisherConfig.control_plane().with_channels(RAY_VIRTUAL_CLUSTER_CHANNEL),
    )
    publish = pubsub.control_plane.publish
    cache = ResourceCache(clock)
    nodes = NodeManager(
        store,
        clock,
        events=events.node,
        publish=publish,
        publish_error=pubsub.observability.publish,
        max_dead_cached=cfg.max_dead_nodes_cached,
        lane_policy=lanes,
    )
    jobs = JobManager(
        store,
        clock,
        events=events.job,
        publish=publish,
        lane_policy=lanes,
        node_is_dead=nodes.is_dead,
    )
    pgs = PlacementGroupManager(
        store,
        clock,
        events=events.pg,
        job_cluster=jobs.virtual_cluster_of,
        job_namespace=jobs.namespace_of,
        job_is_dead=jobs.is_dead,
        lane_policy=lanes,
    )
    virtual_clusters = VirtualClusterManager(
        store,
        clock,
        nodes,
        jobs,
        pgs,
        cache,
        publish=publish,
        lane_policy=lanes,
        launchable=launchable_of(extras),
    )
    health = HealthChecker(nodes, io.raylets, clock, cfg.health)
    return _State(kv, identity, pubsub, cache, nodes, health, jobs, pgs, virtual_clusters)


def _placement_and_load(ctx: Context, io: RayletIo, s: _State) -> _Reach:
    """What reaches raylets about resources: bundles, autoscaler state, syncer, load poll."""
    pg_scheduler = PlacementGroupScheduler(
        s.pgs,
        s.nodes,
        s.cache,
        io.raylets,
        ctx.clock,
        cluster_nodes=s.virtual_clusters.schedulable_nodes,
        config=PlacementConfig(rpc_timeout_s=io.timeout_s),
    )
    autoscaler = AutoscalerStateManager(
        ctx.store,
        s.kv,
        ctx.clock,
        s.nodes,
        s.cache,
        s.pgs,
        io.raylets,
        session_name=s.identity.session_name,
        raylet_timeout_s=io.timeout_s,
        virtual_cluster_section=s.virtual_clusters.autoscaler_section,
        lane_policy=ctx.lane_policy,
    )
    syncer = SyncHub(s.nodes, s.cache, on_heartbeat=s.health.mark_healthy)
    poller = LoadPoller(
        s.nodes,
        s.cache,
        io.raylets,
        ctx.clock,
        io.load_poll,
        on_report=s.health.mark_healthy,
        view_version=syncer.live_version,
    )
    return _Reach(pg_scheduler, autoscaler, syncer, poller)


def _work_managers(ctx: Context, io: RayletIo, events: Events, s: _State) -> _Work:
    """Workers, task events, runtime-env pins and actors."""
    cfg, clock = ctx.cfg, ctx.clock
    workers = WorkerManager(
        ctx.store,
        clock,
        publish=s.pubsub.control_plane.publish,
        worker_events=events.worker,
        max_dead_cached=cfg.max_dead_workers_cached,
        lane_policy=ctx.lane_policy,
    )
    tasks = TaskEventStore(
        max_tasks=cfg.task_events_max_num_task_in_gcs,
        max_profile_events_per_task=cfg.task_events_max_num_profile_events_per_task,
    )
    task_failures = TaskFailureMarker(
        tasks,
        clock,
        worker_dead_delay_ms=cfg.mark_task_failed_on_worker_dead_delay_ms,
        job_done_delay_ms=cfg.mark_task_failed_on_job_done_delay_ms,
    )
    runtime_envs = RuntimeEnvPins(
        s.jobs.all_jobs,
        clock,
        delete=kv_package_deleter(s.kv),
        # the pins and the actors need each other: ``actors`` is bound just below
        holds=held_by_job_or_actors(lambda job_id: actors.has_live_detached(job_id)),  # noqa: PLW0108 (late bound)
        job=s.jobs.get,
    )
    actors = _actor_manager(ctx, io, s, JobRelease(runtime_envs, s.kv))
    return _Work(workers, tasks, task_failures, runtime_envs, actors)


def _actor_manager(ctx: Context, io: RayletIo, s: _State, released: JobRelease) -> ActorManager:
    view = LiveClusterView(
        s.nodes.alive,
        s.cache,
        s.pgs.groups,
        job_cluster=s.jobs.virtual_cluster_of,
        cluster_nodes=s.virtual_clusters.node_filter,
    )
    # the retry back-off of a creation waiting for a node sleeps on the clock
    scheduler = ActorScheduler(io.actors.gateway, view, sleep=ctx.clock.sleep)
    return ActorManager(
        ctx.store,
        ctx.clock,
        scheduler,
        io.actors.gateway,
        s.nodes.alive,
        publish=s.pubsub.control_plane.publish,
        publish_error=s.pubsub.observability.publish,
        job_is_dead=s.jobs.is_dead,
        on_actor_dead=s.pgs.creator_actor_dead,
        on_job_released=released,
        max_dead_cached=ctx.cfg.max_dead_actors_cached,
        kill_timeout_s=io.timeout_s,
        lane_policy=ctx.lane_policy,
    )


def _assemble(
    ctx: Context, io: RayletIo, s: _State, r: _Reach, w: _Work, events: Events
) -> Managers:
    return Managers(
        s.kv,
        s.nodes,
        s.cache,
        s.pgs,
        r.pg_scheduler,
        s.jobs,
        r.autoscaler,
        s.health,
        r.poller,
        io.raylets,
        s.pubsub,
        s.virtual_clusters,
        r.syncer,
        w.workers,
        w.tasks,
        w.runtime_envs,
        w.actors,
        events.worker,
        JobView(s.jobs.all_jobs, s.kv.multi_get, GrpcDriverGateway(security=ctx.security)),
    )
