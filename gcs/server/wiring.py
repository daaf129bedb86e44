"""Every collaborator of one GCS, built and connected here, with no I/O.

:func:`build` constructs the managers, the raylet I/O layer, pubsub and the RPC server,
subscribes every event listener in one visible list per kind of event (the order the events
reach them), and returns the component list the supervisor runs: ``load()`` in list order,
``run()`` all at once, ``close()`` in reverse order.  Nothing here reads the store, binds a
port or starts a task; that is what ``load()`` and ``run()`` are for.

Listener order (each list is the order of delivery; written down in docs/architecture.md):

* node events (NodeManager): resource cache (the node's report row exists before anyone
  reads it) -> raylet client pool (a dead node's channels close) -> health checker ->
  jobs (a dead driver's jobs finish) -> virtual clusters -> placement-group scheduler ->
  autoscaler state (a drained node's DrainNode call ends) -> syncer -> actors;
* job events (JobManager): virtual clusters (``check_job`` may refuse the job first) ->
  placement-group scheduler -> task-failure marker -> runtime-env pins -> actors;
* placement-group events: virtual clusters -> placement-group scheduler;
* worker events (WorkerManager): task-failure marker -> actors.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import structlog

from gcs import RAY_VERSION
from gcs.clock import Clock
from gcs.config import GcsConfig
from gcs.lifecycle import Component, Part
from gcs.managers.actors import ActorManager
from gcs.managers.actors.cluster_view import LiveClusterView
from gcs.managers.actors.scheduler import ActorScheduler
from gcs.managers.autoscaler_state import AutoscalerStateManager
from gcs.managers.cluster_meta import ClusterIdentity
from gcs.managers.events import (
    JobEvents,
    NodeEvents,
    PlacementGroupEvents,
    Prepared,
    WorkerEvents,
)
from gcs.managers.exported_functions import remove_exports
from gcs.managers.health import HealthChecker
from gcs.managers.job_view import JobView
from gcs.managers.jobs import JobManager
from gcs.managers.kv import KvManager
from gcs.managers.lane import ResolvePolicy
from gcs.managers.nodes import NodeManager
from gcs.managers.pg_scheduler import PlacementConfig, PlacementGroupScheduler
from gcs.managers.placement_groups import PlacementGroupManager
from gcs.managers.resources import LoadPoller, ResourceCache
from gcs.managers.restart_notice import RestartNotice
from gcs.managers.runtime_env import RuntimeEnvPins
from gcs.managers.sync_hub import SyncHub
from gcs.managers.task_failures import TaskFailureMarker
from gcs.managers.tasks import TaskEventStore
from gcs.managers.virtual_clusters import VirtualClusterManager
from gcs.managers.workers import WorkerManager
from gcs.proto import gcs_pb2
from gcs.pubsub.channels import RAY_VIRTUAL_CLUSTER_CHANNEL
from gcs.pubsub.config import PublisherConfig
from gcs.pubsub.runtime import GcsPubSub
from gcs.rpc.drivers import GrpcDriverGateway
from gcs.rpc.raylets.actors import ActorGateway, GrpcActorGateway
from gcs.rpc.raylets.budget import budget_for, nofile_soft_limit
from gcs.rpc.raylets.gateway import RayletGateway
from gcs.rpc.raylets.grpc_gateway import GrpcRayletGateway
from gcs.rpc.raylets.pool import RayletClientPool
from gcs.rpc.security import Security
from gcs.rpc.server import CallHook
from gcs.rpc.warnings import WarningSampler
from gcs.server.event_stats import HandlerStats, print_periodically
from gcs.server.extras import Extras, autoscaler_component, demo_component, launchable_of
from gcs.server.families import gcs_families
from gcs.server.gc_policy import GcTuning
from gcs.server.head_processes import HeadChildren
from gcs.server.managers import Managers
from gcs.server.metrics import GcsMetrics, MetricSource, on_loop
from gcs.server.metrics_agent import MetricsAgentExporter
from gcs.server.ray_metrics import snapshot_of
from gcs.server.rpc_server import RpcServer
from gcs.server.store_open import open_configured
from gcs.store import Store
from gcs.store.metered import MeteredStore

__all__ = ["Extras", "Wiring", "build"]


@dataclass(slots=True)
class Wiring:
    managers: Managers
    identity: ClusterIdentity
    rpc: RpcServer
    gc: GcTuning
    children: HeadChildren
    components: list[Component]
    """In load order; the supervisor closes them in reverse."""
    node_events: NodeEvents
    job_events: JobEvents
    pg_events: PlacementGroupEvents
    worker_events: WorkerEvents


def build(
    config: GcsConfig,
    *,
    store: Store,
    owns_store: bool,
    clock: Clock,
    security: Security,
    metrics: GcsMetrics,
    advertised_host: str,
    lane_policy: ResolvePolicy | None = None,
    raylets: RayletGateway | None = None,
    actor_gateway: ActorGateway | None = None,
    extras: Extras | None = None,
    admit: Callable[[], bool] | None = None,
    start_heap_frozen: bool = False,
) -> Wiring:
    """``store``: the backend, opened at load (``owns_store``: closed at the end too);
    managers get it metered.  ``raylets`` / ``actor_gateway``: fakes in tests.  ``admit``
    (``--ha``, one leader term of ``gcs.server.ha``): asked per call whether this GCS still
    holds the lease; the port is then shared (SO_REUSEPORT).  ``start_heap_frozen``: the
    process froze its start-up heap before (``gcs.server.gc_policy.GcTuning``)."""
    cfg = config
    extras = extras or Extras()
    metered = metrics.metered(store)
    kv = KvManager(metered)
    identity = ClusterIdentity(
        metered, kv, session_name=cfg.session_name, python_version=cfg.python_version
    )

    # -- raylet I/O ------------------------------------------------------------------------
    load_poll = cfg.load_poll
    if security.tls is not None and load_poll.transport == "h2":
        load_poll = dataclasses.replace(load_poll, transport="grpc")  # h2 client: no TLS
    if raylets is None:
        raylets = GrpcRayletGateway(
            budget_for(cfg.raylet_io, nofile_soft_limit()),
            poll_transport=load_poll.transport,
            security=security,
        )
    actor_io = _actor_io(raylets, actor_gateway, security)
    timeout_s = cfg.raylet_rpc_timeout_ms / 1000

    # -- managers --------------------------------------------------------------------------
    pubsub = GcsPubSub.create(
        clock,
        control_plane=PublisherConfig.control_plane().with_channels(RAY_VIRTUAL_CLUSTER_CHANNEL),
    )
    publish = pubsub.control_plane.publish
    node_events, job_events = NodeEvents(), JobEvents()
    pg_events, worker_events = PlacementGroupEvents(), WorkerEvents()
    cache = ResourceCache(clock)
    nodes = NodeManager(
        metered,
        clock,
        events=node_events,
        publish=publish,
        publish_error=pubsub.observability.publish,
        max_dead_cached=cfg.max_dead_nodes_cached,
        lane_policy=lane_policy,
    )
    health = HealthChecker(nodes, raylets, clock, cfg.health)
    jobs = JobManager(
        metered,
        clock,
        events=job_events,
        publish=publish,
        lane_policy=lane_policy,
        node_is_dead=nodes.is_dead,
    )
    pgs = PlacementGroupManager(
        metered,
        clock,
        events=pg_events,
        job_cluster=jobs.virtual_cluster_of,
        job_namespace=jobs.namespace_of,
        job_is_dead=jobs.is_dead,
        lane_policy=lane_policy,
    )
    virtual_clusters = VirtualClusterManager(
        metered,
        clock,
        nodes,
        jobs,
        pgs,
        cache,
        publish=publish,
        lane_policy=lane_policy,
        launchable=launchable_of(extras),
    )
    pg_scheduler = PlacementGroupScheduler(
        pgs,
        nodes,
        cache,
        raylets,
        clock,
        cluster_nodes=virtual_clusters.schedulable_nodes,
        config=PlacementConfig(rpc_timeout_s=timeout_s),
    )
    autoscaler = AutoscalerStateManager(
        metered,
        kv,
        clock,
        nodes,
        cache,
        pgs,
        raylets,
        session_name=identity.session_name,
        raylet_timeout_s=timeout_s,
        virtual_cluster_section=virtual_clusters.autoscaler_section,
        lane_policy=lane_policy,
    )
    syncer = SyncHub(nodes, cache, on_heartbeat=health.mark_healthy)
    poller = LoadPoller(
        nodes,
        cache,
        raylets,
        clock,
        load_poll,
        on_report=health.mark_healthy,
        view_version=syncer.live_version,
    )
    workers = WorkerManager(
        metered,
        clock,
        publish=publish,
        worker_events=worker_events,
        max_dead_cached=cfg.max_dead_workers_cached,
        lane_policy=lane_policy,
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

    async def delete_package(uri: str) -> None:
        await kv.delete(b"", uri.encode(), by_prefix=False)

    runtime_envs = RuntimeEnvPins(
        jobs.all_jobs,
        clock,
        delete=delete_package,
        # a detached actor keeps its job's runtime env (``actors`` is built below)
        holds=lambda job: not job.is_dead or actors.has_live_detached(job.job_id),
        job=jobs.get,
    )

    async def job_released(job_id: bytes) -> None:
        """A finished job's last detached actor died (or it had none): what Ray's GCS
        keeps for a job until then goes."""
        runtime_envs.on_job_released(job_id)
        await remove_exports(kv, job_id)

    actors = ActorManager(
        metered,
        clock,
        ActorScheduler(
            actor_io.gateway,
            LiveClusterView(
                nodes.alive,
                cache,
                pgs.groups,
                job_cluster=jobs.virtual_cluster_of,
                cluster_nodes=virtual_clusters.node_filter,
            ),
            sleep=clock.sleep,  # the retry back-off of a creation waiting for a node
        ),
        actor_io.gateway,
        nodes.alive,
        publish=publish,
        publish_error=pubsub.observability.publish,
        job_is_dead=jobs.is_dead,
        on_actor_dead=pgs.creator_actor_dead,
        on_job_released=job_released,
        max_dead_cached=cfg.max_dead_actors_cached,
        kill_timeout_s=timeout_s,
        lane_policy=lane_policy,
    )

    # -- listeners, in delivery order (see the module docstring) --------------------------
    node_events.subscribe(
        cache,
        _ForgetRaylet(raylets),
        health,
        jobs.node_listener,
        virtual_clusters,
        pg_scheduler,
        autoscaler,
        syncer,
        actors.node_listener,
    )
    job_events.subscribe(
        virtual_clusters, pg_scheduler, task_failures, runtime_envs, actors.job_listener
    )
    pg_events.subscribe(virtual_clusters, pg_scheduler)
    worker_events.subscribe(task_failures, actors.worker_listener)

    managers = Managers(
        kv,
        nodes,
        cache,
        pgs,
        pg_scheduler,
        jobs,
        autoscaler,
        health,
        poller,
        raylets,
        pubsub,
        virtual_clusters,
        syncer,
        workers,
        tasks,
        runtime_envs,
        actors,
        worker_events,
        JobView(jobs.all_jobs, kv.multi_get, GrpcDriverGateway(security=security)),
    )

    # -- serving ---------------------------------------------------------------------------
    on_call: CallHook = metrics.on_call
    handler_stats: HandlerStats | None = None
    if cfg.event_stats and cfg.event_stats_print_interval_ms > 0:  # Ray's "Event stats" log
        handler_stats = HandlerStats()
        on_call = _both(metrics.on_call, handler_stats.on_call)
    rpc_warnings = WarningSampler(clock)  # repeated per-request warnings: counted, sampled
    rpc = RpcServer(
        cfg,
        managers,
        identity,
        security,
        clock,
        advertised_host=advertised_host,
        on_call=on_call,
        warnings=rpc_warnings,
        admit=admit,
    )

    def bind_address() -> str:
        return f"{cfg.host}:{rpc.port}"

    def advertised_address() -> str:
        return f"{advertised_host}:{rpc.port}"

    gc = GcTuning(
        clock,
        gen0_threshold=cfg.gc_gen0_threshold,
        gen1_threshold=cfg.gc_gen1_threshold,
        freeze_survivors=cfg.gc_freeze_survivors,
        start_heap_frozen=start_heap_frozen,
    )
    children = HeadChildren(
        head=cfg.head,
        dashboard=cfg.dashboard,
        head_raylet=cfg.head_raylet,
        ray_python=cfg.ray_python,
        temp_dir=cfg.temp_dir,
        dashboard_host=cfg.dashboard_host or cfg.host,
        dashboard_port=cfg.dashboard_port,
        head_raylet_args=cfg.head_raylet_args,
        session_name=identity.session_name,
        cluster_id_hex=lambda: identity.meta.cluster_id_hex,
        gcs_address=advertised_address,
        node_ip=advertised_host,
        serving=rpc.serving,
    )

    sources: list[MetricSource] = []

    async def load_metrics() -> None:
        """Figures read from their owners at scrape time, on the loop that owns them."""
        loop = asyncio.get_running_loop()
        sources.append(on_loop(loop, lambda: gcs_families(managers)))
        sources.append(on_loop(loop, rpc_warnings.metric_families))
        for source in sources:
            metrics.add_source(source)
        if cfg.metrics_port >= 0:
            metrics.serve(cfg.host, cfg.metrics_port)

    async def open_store() -> None:  # a given store too: opening an open store is a no-op
        await open_configured(store, clock, cfg)

    async def close_store() -> None:
        if owns_store:
            await store.close()

    def once_serving(run: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """Raylets are reached only once the GCS answers them (load -> serve -> reach)."""

        async def go() -> None:
            await rpc.serving()
            await run()

        return go

    async def close_metrics() -> None:
        for source in sources:  # this wiring's managers are gone (an HA term ended)
            metrics.remove_source(source)
        if cfg.metrics_port >= 0:
            metrics.close()

    components: list[Component] = [
        Part("store", load=open_store, close=close_store),
        Part("metrics", load=load_metrics, close=close_metrics),
        Part("raylets", close=raylets.close),
        Part("actor_io", close=actor_io.close),
        identity,
        Part("nodes", load=nodes.load),
        Part("placement_groups", load=pgs.load),
        Part("jobs", load=jobs.load, close=jobs.close),
        Part("workers", load=workers.load),
        Part("autoscaler_state", load=autoscaler.load),
        Part(  # replays from the node table loaded above; periodic passes on the clock
            "virtual_clusters",
            load=virtual_clusters.load,
            run=lambda: _all(
                virtual_clusters.run_periodic(
                    cfg.node_instances_replenish_interval_ms,
                    virtual_clusters.replenish_once,
                    "replenish",
                ),
                virtual_clusters.run_periodic(
                    cfg.expired_job_clusters_gc_interval_ms,
                    virtual_clusters.collect_expired_once,
                    "job-cluster-gc",
                ),
            ),
            close=virtual_clusters.close,
        ),
        Part("actors", load=actors.load, close=actors.close),  # after nodes: dead owners' nodes
        Part("task_failures", close=task_failures.close),
        Part("load_poller", run=once_serving(poller.run)),
        Part("health", run=once_serving(health.run), close=health.close),
        Part("pg_scheduler", run=once_serving(pg_scheduler.run), close=pg_scheduler.close),
        Part("runtime_envs", run=runtime_envs.run),
        Part("pubsub", run=pubsub.run, close=pubsub.stop),
        Part("event_stats", run=_event_stats_printer(handler_stats, clock, cfg)),
        *_metrics_agent(cfg, managers, metered, clock, security, advertised_host),
        gc,  # after every load: freezes what start-up loaded
        rpc,
        RestartNotice(
            nodes,
            poller,
            raylets,
            actors,
            clock,
            contacts_per_s=cfg.raylet_io.startup_contacts_per_s,
            max_concurrent=cfg.health.max_concurrent,
            serving=rpc.serving,
        ),
        children,
    ]
    if extras.autoscaler is not None:
        components.append(
            autoscaler_component(
                extras.autoscaler,
                gcs_address=bind_address,
                store=store,
                security=security,
                data_dir=cfg.data_dir,
                metrics=metrics,
                clock=clock,
                serving=rpc.serving,
            )
        )
    if extras.demo_nodes:
        components.append(
            demo_component(
                extras.demo_nodes,
                gcs_address=bind_address,
                security=security,
                agents=extras.autoscaler is None,  # else the autoscaler's provider runs them
                serving=rpc.serving,
            )
        )
    return Wiring(
        managers,
        identity,
        rpc,
        gc,
        children,
        components,
        node_events,
        job_events,
        pg_events,
        worker_events,
    )


async def _all(*loops: Awaitable[None]) -> None:
    """Run loops together; the first to fail cancels the others and is raised."""
    async with asyncio.TaskGroup() as group:
        for loop in loops:
            group.create_task(loop)  # type: ignore[arg-type]


@dataclass(slots=True)
class _ActorIo:
    gateway: ActorGateway
    owned: list[Callable[[], Awaitable[None]]]

    async def close(self) -> None:
        for close in self.owned:
            await close()


def _actor_io(raylets: RayletGateway, given: ActorGateway | None, security: Security) -> _ActorIo:
    """The actor gateway: given (tests), or over the raylet gateway's client pool (a raylet
    gateway given by the caller: actor calls get a pool of their own)."""
    if given is not None:
        return _ActorIo(given, [])
    if isinstance(raylets, GrpcRayletGateway):
        pool, owned = raylets.pool, []
    else:
        pool = RayletClientPool(64, security)
        owned = [pool.close]
    gateway = GrpcActorGateway(pool, security=security)
    return _ActorIo(gateway, [gateway.close, *owned])


class _ForgetRaylet:
    """Node listener: a dead node's raylet connections are closed."""

    def __init__(self, raylets: RayletGateway) -> None:
        self._raylets = raylets

    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
        return None

    def on_nodes_loaded(
        self, nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo], prepared: Prepared
    ) -> None:
        return None

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        self._raylets.forget(node.node_id)


def _both(first: CallHook, second: CallHook) -> CallHook:
    def on_call(path: str, code: str, seconds: float) -> None:
        first(path, code, seconds)
        second(path, code, seconds)

    return on_call


def _metrics_agent(
    cfg: GcsConfig,
    managers: Managers,
    metered: MeteredStore,
    clock: Clock,
    security: Security,
    node_address: str,
) -> list[Component]:
    """Ray's metrics export to the node's agent: on the port given, or (0, as Ray starts its
    GCS before the agent) on the one the head node registers with."""
    if cfg.metrics_agent_port < 0 or not cfg.enable_metrics_collection:
        return []

    def target() -> str | None:
        port = cfg.metrics_agent_port
        if port == 0:
            head = next((n for n in managers.nodes.alive.values() if n.is_head_node), None)
            port = head.metrics_agent_port if head is not None else 0
        return f"127.0.0.1:{port}" if port > 0 else None  # where Ray's GCS dials it

    labels = {
        "Component": "gcs_server",
        "NodeAddress": node_address,
        "SessionName": cfg.session_name,
        "Version": RAY_VERSION,
        "WorkerId": "",
    }
    return [
        MetricsAgentExporter(
            target=target,
            snapshot=snapshot_of(managers, metered.latency_histograms),
            global_labels=labels,
            interval_ms=cfg.metrics_report_interval_ms,
            clock=clock,
            security=security,
        )
    ]


def _event_stats_printer(
    stats: HandlerStats | None, clock: Clock, cfg: GcsConfig
) -> Callable[[], Awaitable[None]] | None:
    """Ray's periodic "Main service Event stats" log block, when on (see event_stats)."""
    if stats is None:
        return None
    emit = structlog.get_logger("gcs.event_stats").info
    return lambda: print_periodically(stats, clock, cfg.event_stats_print_interval_ms, emit)
