"""``GcsServer``: open the store, load and repair state, then serve; stop idempotently.

Startup order (design.md): load -> repair -> serve.  Background loops (load polling, health
checks) run under one supervisor: if one dies the server stops and the error is raised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import os
import pathlib
import random
import shlex
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from gcs.clock import Clock, SystemClock, now_ms
from gcs.config import GcsConfig, kv_put_request_bytes
from gcs.errors import GcsError
from gcs.managers.actor_scheduler import ActorScheduler
from gcs.managers.actor_view import LiveClusterView
from gcs.managers.actors import ActorManager
from gcs.managers.autoscaler_state import AutoscalerStateManager
from gcs.managers.cluster_meta import ClusterMeta, load_or_create
from gcs.managers.events import JobEvents, NodeEvents, PlacementGroupEvents, WorkerEvents
from gcs.managers.head import virtual_head
from gcs.managers.health import HealthChecker
from gcs.managers.jobs import JobManager
from gcs.managers.kv import KvManager
from gcs.managers.lane import ResolvePolicy
from gcs.managers.nodes import NodeManager
from gcs.managers.pg_scheduler import PlacementConfig, PlacementGroupScheduler
from gcs.managers.placement_groups import PlacementGroupManager
from gcs.managers.resources import LoadPoller, ResourceCache
from gcs.managers.runtime_env import RuntimeEnvPins
from gcs.managers.startup_spread import spread, spread_window_s
from gcs.managers.syncer import SyncHub
from gcs.managers.task_failures import TaskFailureMarker
from gcs.managers.tasks import TaskEventStore
from gcs.managers.virtual_clusters import VirtualClusterManager
from gcs.managers.workers import WorkerManager
from gcs.proto import gcs_pb2
from gcs.pubsub.channels import RAY_VIRTUAL_CLUSTER_CHANNEL
from gcs.pubsub.config import PublisherConfig
from gcs.pubsub.runtime import GcsPubSub
from gcs.rpc import method_path, service_handler, wire_service_name
from gcs.rpc import services as svc
from gcs.rpc.front import (
    ByteBudget,
    Forwarder,
    FrontServer,
    GrpcRouter,
    h2_limits,
    hot_methods,
    native_methods,
)
from gcs.rpc.front.sync import SyncDispatcher
from gcs.rpc.raylets.actors import ActorGateway, GrpcActorGateway
from gcs.rpc.raylets.budget import budget_for, nofile_soft_limit
from gcs.rpc.raylets.gateway import RayletGateway, raylet_address
from gcs.rpc.raylets.grpc_gateway import GrpcRayletGateway
from gcs.rpc.raylets.pool import RayletClientPool
from gcs.rpc.security import Security
from gcs.rpc.server import LONG_POLL_SERVER_OPTIONS, HandlerTable
from gcs.rpc.warnings import WarningSampler
from gcs.server import head_processes
from gcs.server.addresses import advertised_host
from gcs.server.gc_policy import SurvivorFreezer
from gcs.server.head_processes import SupervisedChild
from gcs.server.interceptors import HEALTH_PREFIX, CallGuard, CallGuardInterceptor
from gcs.server.metrics import (
    GcsMetrics,
    counter,
    counters,
    gauge,
    on_loop,
    pubsub_families,
)
from gcs.server.reflection import wire_pool
from gcs.services.actors import ActorInfoServicer
from gcs.services.autoscaler import AutoscalerStateServicer
from gcs.services.jobs_pgs import JobInfoServicer, PlacementGroupInfoServicer
from gcs.services.kv import InternalKVServicer
from gcs.services.node_info import NodeInfoServicer
from gcs.services.node_resources import NodeResourceInfoServicer
from gcs.services.pubsub import PubSubServicer
from gcs.services.syncer import RaySyncerServicer
from gcs.services.virtual_clusters import VirtualClusterInfoServicer
from gcs.services.workers_tasks import RuntimeEnvServicer, TaskInfoServicer, WorkerInfoServicer
from gcs.store import Store, StoreUnavailable, store_from_url
from gcs.store.metered import MeteredStore

log = structlog.get_logger("gcs.server")
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"]


@dataclass(slots=True)
class Managers:
    kv: KvManager
    nodes: NodeManager
    resources: ResourceCache
    placement_groups: PlacementGroupManager
    pg_scheduler: PlacementGroupScheduler
    jobs: JobManager
    autoscaler: AutoscalerStateManager
    health: HealthChecker
    poller: LoadPoller
    raylets: RayletGateway
    pubsub: GcsPubSub
    virtual_clusters: VirtualClusterManager
    syncer: SyncHub
    workers: WorkerManager
    tasks: TaskEventStore
    runtime_envs: RuntimeEnvPins
    actors: ActorManager
    worker_events: WorkerEvents
    """Emit worker deaths here (``ReportWorkerFailure``): the actor manager listens."""


class GcsServer:
    def __init__(
        self,
        config: GcsConfig,
        *,
        store: Store | None = None,
        clock: Clock | None = None,
        lane_policy: ResolvePolicy | None = None,
        security: Security | None = None,
        raylets: RayletGateway | None = None,
        actor_gateway: ActorGateway | None = None,
    ) -> None:
        self.config = config
        self._security = security
        self.clock = clock or SystemClock()
        self._lane_policy = lane_policy
        """How each manager's lane asks the store about ambiguous writes (default if None)."""
        self._store = store
        self._owns_store = store is None
        self._raylets = raylets
        self._actor_gateway = actor_gateway
        self._closers: list[Callable[[], Awaitable[None]]] = []
        """Closed at stop, in order (what start built for itself)."""
        self.metrics = GcsMetrics()
        self.rpc_warnings = WarningSampler(self.clock)
        """Repeated per-request warnings: counted, and sampled in the log."""
        self.meta: ClusterMeta | None = None
        self.managers: Managers | None = None
        self.port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._front: FrontServer | None = None
        self._private_dir = ""
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self._stopping = False
        self.gc_freezer: SurvivorFreezer | None = None
        self.advertised_host = advertised_host(config.host)
        self.children: list[SupervisedChild] = []
        """Ray processes run beside a ``--head`` GCS (``gcs.server.head_processes``)."""

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def advertised_address(self) -> str:
        """``host:port`` for others to dial: the bind address, or with ``--host 0.0.0.0``
        this host's own address (``gcs.server.addresses``)."""
        return f"{self.advertised_host}:{self.port}"

    @property
    def store(self) -> Store:
        assert self._store is not None, "server not started"
        return self._store

    async def _open_store(self) -> Store:
        if self._store is None:
            url = self.config.storage_url()
            if url.startswith("sqlite"):
                await asyncio.to_thread(
                    pathlib.Path(self.config.data_dir).mkdir, parents=True, exist_ok=True
                )
            self._store = store_from_url(
                url, namespace=self.config.namespace, redis=self.config.redis.options()
            )
        delay = 0.2
        for attempt in range(8):
            try:
                await self._store.open()
                return self._store
            except StoreUnavailable as err:
                log.warning(
                    "store.unavailable", url=self._store.url, attempt=attempt, error=str(err)
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        await self._store.open()
        return self._store

    @property
    def security(self) -> Security:
        """Auth/TLS in force (resolved at start from config + Ray's environment)."""
        assert self._security is not None, "server not started"
        return self._security

    def _resolve_security(self) -> Security:
        """Before anything else, so a misconfiguration fails the start with one clear line."""
        if self._security is None:
            cfg = self.config
            self._security = Security.for_server(cfg.auth_mode, cfg.auth_token_path)
        log.info("gcs.security", **self._security.describe())
        return self._security

    async def start(self) -> None:
        security = self._resolve_security()
        # managers get the metered store; ``self.store`` stays the backend itself
        store = MeteredStore(await self._open_store(), self.metrics.registry)
        cfg = self.config
        kv = KvManager(store)
        self.meta = await load_or_create(
            store, kv, session_name=cfg.session_name, python_version=cfg.python_version
        )
        load_poll = cfg.load_poll
        if security.tls is not None and load_poll.transport == "h2":
            load_poll = dataclasses.replace(load_poll, transport="grpc")  # h2 client: no TLS
        raylets = self._raylets or GrpcRayletGateway(
            budget_for(cfg.raylet_io, nofile_soft_limit()),
            poll_transport=load_poll.transport,
            security=security,
        )
        pubsub = GcsPubSub.create(
            self.clock,
            control_plane=PublisherConfig.control_plane().with_channels(
                RAY_VIRTUAL_CLUSTER_CHANNEL
            ),
        )
        # Wiring, all at construction.  Event fan-outs come first: emitters and listeners
        # take them as constructor arguments (listeners subscribe in their constructors),
        # so node events reach, in order: resource cache, client pool, health checker, VC.
        cache = ResourceCache(self.clock)
        node_events = NodeEvents(cache, _ForgetRaylet(raylets))
        job_events = JobEvents()
        pg_events = PlacementGroupEvents()
        nodes = NodeManager(
            store,
            self.clock,
            events=node_events,
            publish=pubsub.control_plane.publish,
            max_dead_cached=cfg.max_dead_nodes_cached,
            lane_policy=self._lane_policy,
        )
        health_checker = HealthChecker(
            nodes, raylets, self.clock, cfg.health, node_events=node_events
        )
        jobs = JobManager(
            store,
            self.clock,
            events=job_events,
            publish=pubsub.control_plane.publish,
            lane_policy=self._lane_policy,
            node_events=node_events,
            node_is_dead=lambda node_id: node_id in nodes.dead,
        )
        pgs = PlacementGroupManager(
            store,
            self.clock,
            events=pg_events,
            job_cluster=jobs.virtual_cluster_of,
            job_namespace=jobs.namespace_of,
            job_is_dead=jobs.is_dead,
            lane_policy=self._lane_policy,
        )
        # Hears node events only once its load() replayed the node table loaded below.
        virtual_clusters = VirtualClusterManager(
            store,
            self.clock,
            nodes,
            jobs,
            pgs,
            cache,
            node_events=node_events,
            job_events=job_events,
            pg_events=pg_events,
            publish=pubsub.control_plane.publish,
            lane_policy=self._lane_policy,
        )
        pg_scheduler = PlacementGroupScheduler(
            pgs,
            nodes,
            cache,
            raylets,
            self.clock,
            node_events=node_events,
            job_events=job_events,
            pg_events=pg_events,
            cluster_nodes=virtual_clusters.schedulable_nodes,
            config=PlacementConfig(rpc_timeout_s=cfg.raylet_rpc_timeout_ms / 1000),
        )
        autoscaler = AutoscalerStateManager(
            store,
            kv,
            self.clock,
            nodes,
            cache,
            pgs,
            raylets,
            session_name=self.meta.session_name,
            raylet_timeout_s=cfg.raylet_rpc_timeout_ms / 1000,
            virtual_cluster_section=virtual_clusters.autoscaler_section,
            lane_policy=self._lane_policy,
            node_events=node_events,
        )
        syncer = SyncHub(
            nodes, cache, node_events=node_events, on_heartbeat=health_checker.mark_healthy
        )
        poller = LoadPoller(
            nodes,
            cache,
            raylets,
            self.clock,
            load_poll,
            on_report=health_checker.mark_healthy,
            view_version=syncer.live_version,
        )
        worker_events = WorkerEvents()
        workers = WorkerManager(
            store,
            self.clock,
            publish=pubsub.control_plane.publish,
            worker_events=worker_events,
            max_dead_cached=cfg.max_dead_workers_cached,
            lane_policy=self._lane_policy,
        )
        tasks = TaskEventStore(
            max_tasks=cfg.task_events_max_num_task_in_gcs,
            max_profile_events_per_task=cfg.task_events_max_num_profile_events_per_task,
        )
        task_failures = TaskFailureMarker(
            tasks,
            self.clock,
            worker_events=worker_events,
            job_events=job_events,
            worker_dead_delay_ms=cfg.mark_task_failed_on_worker_dead_delay_ms,
            job_done_delay_ms=cfg.mark_task_failed_on_job_done_delay_ms,
        )
        self._closers.append(task_failures.close)
        runtime_envs = RuntimeEnvPins(jobs.jobs.values, self.clock, job_events=job_events)
        actor_gateway = self._actor_gateway
        if actor_gateway is None:
            if isinstance(raylets, GrpcRayletGateway):
                pool = raylets.pool
            else:  # a raylet gateway given by the caller: actor calls get a pool of their own
                pool = RayletClientPool(64, security)
                self._closers.append(pool.close)
            built = GrpcActorGateway(pool, security=security)
            self._closers.append(built.close)
            actor_gateway = built
        actor_view = LiveClusterView(
            nodes.alive,
            cache,
            pgs.groups,
            job_cluster=jobs.virtual_cluster_of,
            cluster_nodes=virtual_clusters.node_filter,
        )
        actors = ActorManager(
            store,
            self.clock,
            ActorScheduler(actor_gateway, actor_view),
            actor_gateway,
            nodes.alive,
            publish=pubsub.control_plane.publish,
            node_events=node_events,
            job_events=job_events,
            worker_events=worker_events,
            job_is_dead=jobs.is_dead,
            max_dead_cached=cfg.max_dead_actors_cached,
            kill_timeout_s=cfg.raylet_rpc_timeout_ms / 1000,
            lane_policy=self._lane_policy,
        )
        # load -> repair -> serve
        await nodes.load()
        await pgs.load()
        await jobs.load()
        await workers.load()
        await autoscaler.load()
        await virtual_clusters.load()  # replays from the node table loaded above
        await actors.load()  # after nodes: actors of dead owners' nodes are marked dead
        self.managers = Managers(
            kv,
            nodes,
            cache,
            pgs,
            pg_scheduler,
            jobs,
            autoscaler,
            health_checker,
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
        )
        self._tune_gc()
        await self._start_grpc()
        await pubsub.start()
        self.metrics.add_source(on_loop(asyncio.get_running_loop(), self._metric_families))
        self.metrics.add_source(
            on_loop(asyncio.get_running_loop(), self.rpc_warnings.metric_families)
        )
        if cfg.metrics_port >= 0:
            self.metrics_port = self.metrics.serve(cfg.host, cfg.metrics_port)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(poller.run(), name="load-poller"),
            loop.create_task(health_checker.run(), name="health-checker"),
            loop.create_task(pg_scheduler.run(), name="pg-scheduler"),
            loop.create_task(self._reclaim_frozen(), name="gc-reclaim"),
            loop.create_task(self._expire_runtime_envs(), name="runtime-env-gc"),
            loop.create_task(
                virtual_clusters.run_periodic(
                    cfg.node_instances_replenish_interval_ms,
                    virtual_clusters.replenish_once,
                    "replenish",
                ),
                name="vc-replenish",
            ),
            loop.create_task(
                virtual_clusters.run_periodic(
                    cfg.expired_job_clusters_gc_interval_ms,
                    virtual_clusters.collect_expired_once,
                    "job-cluster-gc",
                ),
                name="vc-job-cluster-gc",
            ),
        ]
        for task in self._tasks:
            task.add_done_callback(self._on_task_done)
        if nodes.alive:  # restart: reach known raylets only now, spread and bounded
            window_s = spread_window_s(len(nodes.alive), cfg.raylet_io.startup_contacts_per_s)
            rng = random.Random()
            poller.spread_first_polls(spread(nodes.alive, self.clock.monotonic_s(), window_s, rng))
            notify_at = spread(nodes.alive, loop.time(), window_s, rng)
            self._tasks.append(loop.create_task(self._notify_restart(notify_at), name="notify"))
        log.info(
            "gcs.started",
            address=self.address,
            storage=store.url,
            cluster_id=self.meta.cluster_id_hex,
            metrics_port=self.metrics_port,
            alive_nodes=len(nodes.alive),
            new_cluster=self.meta.created,
        )
        await self._start_children()

    def _tune_gc(self) -> None:
        """Bound cyclic-GC pauses (see config and ``gc_policy``): freeze what start-up
        loaded, collect young objects in small batches, and freeze what survives a
        generation-1 collection so no automatic collection scans the long-lived heap."""
        cfg = self.config
        if cfg.gc_gen0_threshold > 0:
            if gc.get_freeze_count() == 0:  # once per process: only what start-up loaded
                gc.collect()
                gc.freeze()
            _, _, gen2 = gc.get_threshold()
            gc.set_threshold(cfg.gc_gen0_threshold, cfg.gc_gen1_threshold, max(gen2, 100))
            if cfg.gc_freeze_survivors:
                self.gc_freezer = SurvivorFreezer()
                gc.callbacks.append(self.gc_freezer)

    async def _start_grpc(self) -> None:
        assert self.meta is not None and self.managers is not None
        m, cfg = self.managers, self.config
        limits = dataclasses.replace(  # no reply is built past what gRPC may send
            cfg.limits, max_reply_bytes=min(cfg.limits.max_reply_bytes, cfg.grpc_max_message_bytes)
        )
        interceptor = CallGuardInterceptor(self.meta.cluster_id_hex, self.security.token)
        server = grpc.aio.server(
            interceptors=[interceptor],
            options=[
                ("grpc.max_receive_message_length", cfg.grpc_max_message_bytes),
                ("grpc.max_send_message_length", cfg.grpc_max_message_bytes),
                ("grpc.keepalive_time_ms", 10000),
                ("grpc.keepalive_timeout_ms", 20000),
                ("grpc.so_reuseport", 0),
                *LONG_POLL_SERVER_OPTIONS,
            ],
        )
        hook = self.metrics.on_call
        table = HandlerTable(server)
        servicers = [
            (
                svc.NODE_INFO,
                NodeInfoServicer(
                    m.nodes,
                    self.meta.cluster_id,
                    limits=limits,
                    virtual_cluster_nodes=m.virtual_clusters.node_filter,
                    head=self._virtual_head(),
                ),
            ),
            (
                svc.NODE_RESOURCE_INFO,
                NodeResourceInfoServicer(
                    m.nodes,
                    m.resources,
                    m.placement_groups,
                    virtual_cluster_nodes=m.virtual_clusters.node_filter,
                ),
            ),
            (svc.INTERNAL_KV, InternalKVServicer(m.kv, limits=limits)),
            (svc.AUTOSCALER_STATE, AutoscalerStateServicer(m.autoscaler, limits=limits)),
            (svc.JOB_INFO, JobInfoServicer(m.jobs, limits=limits)),
            (svc.WORKER_INFO, WorkerInfoServicer(m.workers, limits=limits)),
            (svc.TASK_INFO, TaskInfoServicer(m.tasks, limits=limits)),
            (svc.RUNTIME_ENV, RuntimeEnvServicer(m.runtime_envs, limits=limits)),
            (
                svc.PLACEMENT_GROUP_INFO,
                PlacementGroupInfoServicer(m.placement_groups, limits=limits),
            ),
            (
                svc.VIRTUAL_CLUSTER_INFO,
                VirtualClusterInfoServicer(m.virtual_clusters, limits=limits),
            ),
            (svc.ACTOR_INFO, ActorInfoServicer(m.actors, limits=limits)),
        ]
        by_method = {"InternalKVPut": kv_put_request_bytes(limits)}
        for descriptor, servicer in servicers:
            handler = service_handler(
                descriptor,
                servicer,
                on_call=hook,
                max_request_bytes=limits.max_request_bytes,
                max_request_bytes_by_method=by_method,
                warnings=self.rpc_warnings,
            )
            table.add_generic_rpc_handlers([handler])
        pubsub_servicers = m.pubsub.servicers(limits)
        table.add_generic_rpc_handlers(
            m.pubsub.handlers(on_call=hook, limits=limits, servicers=pubsub_servicers)
        )
        syncer = RaySyncerServicer(m.syncer, limits=limits, on_call=hook)
        table.add_generic_rpc_handlers([syncer.handler()])
        servicers += [
            (svc.CONTROL_PLANE_PUBSUB, None),
            (svc.OBSERVABILITY_PUBSUB, None),
            (svc.RAY_SYNCER, None),
        ]
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, table)
        names = [wire_service_name(d) for d, _ in servicers]
        for name in ["", *names]:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        # reflection lists what is served: Ray's ray.rpc.* names (see gcs.server.reflection)
        reflected = [
            *(d for d, _ in servicers),
            reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
            health_pb2.DESCRIPTOR.services_by_name["Health"],
        ]
        reflection.enable_server_reflection(
            [*names, reflection.SERVICE_NAME, health.SERVICE_NAME],
            table,
            pool=wire_pool(reflected),
        )
        if cfg.front_server:
            await self._serve_behind_front(table, interceptor.guard, pubsub_servicers)
            return
        try:
            self.port = self.security.add_port(server, f"{cfg.host}:{cfg.port}")
        except RuntimeError:  # grpc's "Failed to bind to address ..."
            self.port = 0
        if self.port == 0:
            raise _port_in_use(cfg.host, cfg.port)
        await server.start()
        self._server = server

    async def _serve_behind_front(
        self,
        table: HandlerTable,
        guard: CallGuard,
        pubsub_servicers: list[tuple[ServiceDescriptor, PubSubServicer]],
    ) -> None:
        """grpc.aio on a private Unix socket (plaintext: the hop never leaves the host, the
        directory is the owner's only); the front server on the GCS port (gcs.rpc.front)."""
        cfg = self.config
        server = table.server
        self._private_dir = await asyncio.to_thread(tempfile.mkdtemp, prefix="gcs", dir="/tmp")
        internal = f"unix:{self._private_dir}/grpc.sock"
        if server.add_insecure_port(internal) == 0:
            raise OSError(errno.EADDRINUSE, f"cannot bind the internal gRPC socket {internal}")
        await server.start()
        self._server = server
        paths = [
            *(method_path(method) for d in svc.SERVED_BY_GCS for method in d.methods),
            *(HEALTH_PREFIX + method.name for method in HEALTH_SERVICE.methods),
        ]
        forwarder = Forwarder(internal, cfg.grpc_max_message_bytes)
        assert self.managers is not None
        router = GrpcRouter(
            hot_methods(pubsub_servicers, cfg.limits.max_request_bytes),
            native_methods(table.handlers, paths),
            guard,
            forwarder,
            on_call=self.metrics.on_call,
            max_message_bytes=cfg.grpc_max_message_bytes,
            syncer=SyncDispatcher(
                self.managers.syncer,
                cfg.limits,
                cfg.grpc_max_message_bytes,
                on_call=self.metrics.on_call,
                warnings=self.rpc_warnings,
            ),
            warnings=self.rpc_warnings,
        )
        tls = self.security.tls
        front = FrontServer(
            router,
            forwarder,
            h2_limits(cfg),
            ssl_context=tls.ssl_server_context() if tls is not None else None,
            budget=ByteBudget(cfg.front_buffer_budget_bytes),
            clock=self.clock,
            warnings=self.rpc_warnings,
        )
        try:
            self.port = await front.start(cfg.host, cfg.port)
        except OSError:
            raise _port_in_use(cfg.host, cfg.port) from None
        self._front = front

    def _virtual_head(self) -> gcs_pb2.GcsNodeInfo | None:
        """``--head``: the record Ray's workers look up (see ``gcs.managers.head``)."""
        if not self.config.head:
            return None
        assert self.meta is not None
        return virtual_head(
            self.meta.cluster_id,
            address=self.advertised_host,
            temp_dir=self.config.temp_dir,
            session_name=self.meta.session_name,
            start_time_ms=now_ms(self.clock),
        )

    async def _start_children(self) -> None:
        """``--dashboard`` / ``--head-raylet``: started once we serve (they call us)."""
        cfg = self.config
        if not cfg.head or not (cfg.dashboard or cfg.head_raylet):
            return
        assert self.meta is not None
        python = head_processes.default_python(cfg.ray_python)
        env = head_processes.child_env(python, os.environ)
        session = head_processes.session_dir(cfg.temp_dir, self.meta.session_name)
        logs = session / "logs"
        await asyncio.to_thread(logs.mkdir, parents=True, exist_ok=True)
        specs = []
        if cfg.dashboard:
            argv = head_processes.dashboard_argv(
                python,
                host=cfg.dashboard_host or cfg.host,
                port=cfg.dashboard_port,
                gcs_address=self.advertised_address,
                cluster_id_hex=self.meta.cluster_id_hex,
                node_ip=self.advertised_host,
                temp_dir=cfg.temp_dir,
                session_dir=session,
            )
            specs.append(
                head_processes.ChildSpec("dashboard", argv, str(logs / "dashboard.out"), env)
            )
            dashboard_at = advertised_host(cfg.dashboard_host or cfg.host)
            log.info(
                "dashboard.starting",
                url=f"http://{dashboard_at}:{cfg.dashboard_port}",
                log=str(logs / head_processes.DASHBOARD_LOG),
            )
            if not cfg.head_raylet:
                log.warning(
                    "dashboard.no_head_raylet",
                    hint="`ray job submit` waits for a head node's agent: add --head-raylet",
                )
        if cfg.head_raylet:
            argv = head_processes.head_raylet_argv(
                python,
                gcs_address=self.advertised_address,
                node_ip=self.advertised_host,
                temp_dir=cfg.temp_dir,
                extra_args=shlex.split(cfg.head_raylet_args),
            )
            specs.append(
                head_processes.ChildSpec(
                    "head-raylet",
                    argv,
                    str(logs / "gcs_head_raylet.out"),
                    env,
                    pidfile=str(logs / "gcs_head_raylet.pid"),
                )
            )
        for spec in specs:
            child = head_processes.SupervisedChild(spec)
            child.start()
            self.children.append(child)

    async def _notify_restart(self, notify_at: dict[bytes, float]) -> None:
        """Tell raylets known from the store that the GCS restarted (Ray does the same).

        Each at its time (loop clock, see ``startup_spread``), a bounded number at once: a
        notification task exists only once it has a slot.
        """
        assert self.managers is not None
        raylets, nodes, actors = self.managers.raylets, self.managers.nodes, self.managers.actors
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.config.health.max_concurrent)
        pending: set[asyncio.Task[None]] = set()

        async def notify(node_id: bytes, address: str) -> None:
            try:
                await raylets.notify_gcs_restart(node_id, address, 5.0)
            except GcsError as err:
                log.info("raylet.notify_failed", node_id=node_id.hex(), error=err.message)
            else:
                log.info("raylet.notified_restart", node_id=node_id.hex())
            try:
                node = nodes.alive.get(node_id)
                if node is not None:
                    await actors.release_unused_workers(node)
            finally:
                slots.release()

        try:
            for node_id, at in sorted(notify_at.items(), key=lambda item: item[1]):
                delay = at - loop.time()
                if delay > 0.001:
                    await asyncio.sleep(delay)
                node = nodes.alive.get(node_id)
                if node is None:
                    continue
                await slots.acquire()
                task = loop.create_task(notify(node_id, raylet_address(node)))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.gather(*pending)
        finally:
            for task in pending:
                task.cancel()

    def _metric_families(self) -> list[Any]:
        """Figures read from their owners at scrape time (gcs.server.metrics)."""
        m = self.managers
        if m is None:
            return []
        stats = m.poller.stats
        out = [
            gauge(
                "gcs_nodes",
                "Nodes by state",
                {("ALIVE",): len(m.nodes.alive), ("DEAD",): len(m.nodes.dead)},
                labels=("state",),
            ),
            gauge(
                "gcs_load_poll_round_seconds",
                "Duration of the last load-poll round",
                stats.last_round_s,
            ),
            gauge(
                "gcs_load_poll_max_staleness_seconds",
                "Age of the oldest node resource report",
                stats.max_staleness_s,
            ),
            counter("gcs_load_poll_ok", "Successful GetResourceLoad calls", stats.polls_ok),
            counter("gcs_load_poll_failures", "Failed GetResourceLoad calls", stats.polls_failed),
            counter(
                "gcs_load_poll_skipped_synced",
                "Polls left out: unchanged syncer view, no pending demand (adaptive polling)",
                stats.skipped_synced,
            ),
            counter("gcs_health_check_failures", "Failed raylet health checks", m.health.failures),
            counter("gcs_health_checks", "Raylet health-check RPCs made", m.health.checks),
            gauge("gcs_syncer_streams", "Raylets connected to the syncer", len(m.syncer.peers)),
            counters(
                "gcs_syncer_messages",
                "Syncer messages by outcome",
                {
                    ("accepted",): m.syncer.stats.accepted,
                    ("stale",): m.syncer.stats.stale,
                    ("unknown_node",): m.syncer.stats.unknown_node,
                    ("undecodable",): m.syncer.stats.undecodable,
                    ("relayed",): m.syncer.stats.relayed,
                    ("coalesced",): m.syncer.stats.coalesced,
                },
                labels=("outcome",),
            ),
            gauge("gcs_task_events_stored", "Task attempts with events held", len(m.tasks)),
            gauge(
                "gcs_pending_resource_shapes",
                "Distinct pending resource shapes",
                len(m.resources.demand),
            ),
        ]
        out.append(
            gauge(
                "gcs_actors",
                "Actors by state (dead ones while cached)",
                {(state,): count for state, count in m.actors.count_by_state().items()},
                labels=("state",),
            )
        )
        by_state: dict[tuple[str, ...], float] = {}
        for pg in m.placement_groups.groups.values():
            key = (gcs_pb2.PlacementGroupTableData.PlacementGroupState.Name(pg.state),)
            by_state[key] = by_state.get(key, 0) + 1
        out.append(
            gauge("gcs_placement_groups", "Placement groups by state", by_state, labels=("state",))
        )
        clusters = m.virtual_clusters.registry.clusters()
        kinds: dict[tuple[str, ...], float] = {}
        for cluster in clusters:
            kinds[(cluster.kind.name,)] = kinds.get((cluster.kind.name,), 0) + 1
        out.append(
            gauge("gcs_virtual_clusters", "Virtual clusters by kind", kinds, labels=("kind",))
        )
        out.append(
            gauge(
                "gcs_virtual_cluster_nodes",
                "Node instances per virtual cluster",
                {(c.id,): len(c.members) for c in clusters},
                labels=("virtual_cluster",),
            )
        )
        out.extend(
            pubsub_families(
                {
                    "control_plane": m.pubsub.control_plane.stats(),
                    "observability": m.pubsub.observability.stats(),
                }
            )
        )
        return out

    async def _reclaim_frozen(self) -> None:
        """The GC policy's safety valve: one full collection when resident memory doubled
        (cycles among frozen objects are otherwise never reclaimed; see gc_policy)."""
        while True:
            if self.gc_freezer is not None and self.gc_freezer.reclaim_if_grown():
                log.info("gc.reclaimed_frozen", resident_bytes=self.gc_freezer.baseline)
            await asyncio.sleep(1.0)

    async def _expire_runtime_envs(self) -> None:
        """Unreferenced ``gcs://`` runtime-env packages leave internal KV (as in Ray)."""
        assert self.managers is not None
        kv, pins = self.managers.kv, self.managers.runtime_envs
        while True:
            for uri in pins.expire():
                await kv.delete(b"", uri.encode(), by_prefix=False)
                log.info("runtime_env.deleted", uri=uri)
            await asyncio.sleep(1.0)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopping:
            return
        exc = task.exception()
        if exc is not None:
            log.error("gcs.loop_failed", task=task.get_name(), error=repr(exc))
            self._failure = exc
            self._stopped.set()

    async def wait(self) -> None:
        """Until :meth:`stop` or a background loop failed (then its error is raised)."""
        await self._stopped.wait()
        failure = getattr(self, "_failure", None)
        if failure is not None:
            await self.stop()
            raise failure

    async def stop(self, grace_s: float = 2.0) -> None:
        """Idempotent; safe before start."""
        if self._stopping:
            return
        self._stopping = True
        # the head raylet unregisters and the dashboard exits while we still answer them
        await asyncio.gather(*(child.stop() for child in reversed(self.children)))
        if self._front is not None:
            self._front.goaway()  # no new streams: answered polls are not re-held
        if self.managers is not None:
            await self.managers.pubsub.stop()  # answer held long polls before the drain
        if self._front is not None:
            await self._front.stop(grace_s)  # open streams finish; relayed ones reach grpc.aio
        if self._server is not None:
            await self._server.stop(grace_s)
        if self._private_dir:
            shutil.rmtree(self._private_dir, ignore_errors=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.managers is not None:
            await self.managers.pg_scheduler.close()
            await self.managers.virtual_clusters.close()
            await self.managers.actors.close()
            await self.managers.jobs.close()
            await self.managers.health.close()
            await self.managers.raylets.close()
        for close in self._closers:
            await close()
        self.metrics.close()
        if self.gc_freezer is not None and self.gc_freezer in gc.callbacks:
            gc.callbacks.remove(self.gc_freezer)
        if self._store is not None and self._owns_store:
            await self._store.close()
        self._stopped.set()
        log.info("gcs.stopped")

    async def __aenter__(self) -> GcsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def _port_in_use(host: str, port: int) -> OSError:
    return OSError(errno.EADDRINUSE, f"cannot bind the gRPC port {host}:{port} (in use?)")


class _ForgetRaylet:
    """Node listener: a dead node's raylet connections are closed."""

    def __init__(self, raylets: RayletGateway) -> None:
        self._raylets = raylets

    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
        return None

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        self._raylets.forget(node.node_id)
