"""``GcsServer``: open the store, load and repair state, then serve; stop idempotently.

Startup order (design.md): load -> repair -> serve.  Background loops (load polling, health
checks) run under one supervisor: if one dies the server stops and the error is raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import pathlib
from dataclasses import dataclass

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gcs.clock import Clock, SystemClock
from gcs.config import GcsConfig
from gcs.managers.autoscaler_state import AutoscalerStateManager
from gcs.managers.cluster_meta import ClusterMeta, load_or_create
from gcs.managers.health import HealthChecker
from gcs.managers.jobs import JobManager
from gcs.managers.kv import KvManager
from gcs.managers.nodes import NodeManager
from gcs.managers.placement_groups import PlacementGroupManager
from gcs.managers.raylet_clients import RayletClientPool
from gcs.managers.resources import LoadPoller, ResourceCache
from gcs.managers.virtual_clusters import VirtualClusterManager
from gcs.proto import node_manager_pb2
from gcs.pubsub.channels import RAY_VIRTUAL_CLUSTER_CHANNEL
from gcs.pubsub.config import PublisherConfig
from gcs.pubsub.runtime import GcsPubSub
from gcs.rpc import service_handler, wire_service_name
from gcs.rpc import services as svc
from gcs.rpc.server import LONG_POLL_SERVER_OPTIONS
from gcs.server.gc_policy import SurvivorFreezer
from gcs.server.interceptors import ClusterIdInterceptor
from gcs.server.metrics import GcsMetrics
from gcs.services.autoscaler import AutoscalerStateServicer
from gcs.services.jobs_pgs import JobInfoServicer, PlacementGroupInfoServicer
from gcs.services.kv import InternalKVServicer
from gcs.services.node_info import NodeInfoServicer
from gcs.services.node_resources import NodeResourceInfoServicer
from gcs.services.virtual_clusters import VirtualClusterInfoServicer
from gcs.store import Store, StoreUnavailable, store_from_url

log = structlog.get_logger("gcs.server")


@dataclass(slots=True)
class Managers:
    kv: KvManager
    nodes: NodeManager
    resources: ResourceCache
    placement_groups: PlacementGroupManager
    jobs: JobManager
    autoscaler: AutoscalerStateManager
    health: HealthChecker
    poller: LoadPoller
    clients: RayletClientPool
    pubsub: GcsPubSub
    virtual_clusters: VirtualClusterManager


class GcsServer:
    def __init__(
        self,
        config: GcsConfig,
        *,
        store: Store | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self._store = store
        self._owns_store = store is None
        self.metrics = GcsMetrics()
        self.meta: ClusterMeta | None = None
        self.managers: Managers | None = None
        self.port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self._stopping = False
        self.gc_freezer: SurvivorFreezer | None = None

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

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
            self._store = store_from_url(url, namespace=self.config.namespace)
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

    async def start(self) -> None:
        store = await self._open_store()
        cfg = self.config
        kv = KvManager(store)
        self.meta = await load_or_create(kv, session_name=cfg.session_name)
        clients = RayletClientPool()
        pubsub = GcsPubSub.create(
            self.clock,
            control_plane=PublisherConfig.control_plane().with_channels(
                RAY_VIRTUAL_CLUSTER_CHANNEL
            ),
        )
        nodes = NodeManager(
            store,
            self.clock,
            publish=pubsub.control_plane.publish,
            max_dead_cached=cfg.max_dead_nodes_cached,
        )
        cache = ResourceCache(self.clock)
        health_checker = HealthChecker(nodes, clients, self.clock, cfg.health)
        nodes.add_listener(cache)
        nodes.add_listener(health_checker)
        nodes.add_listener(_DropClient(clients))
        pgs = PlacementGroupManager(store, self.clock)
        jobs = JobManager(store, self.clock)
        autoscaler = AutoscalerStateManager(
            store,
            kv,
            self.clock,
            nodes,
            cache,
            pgs,
            clients,
            session_name=self.meta.session_name,
            raylet_timeout_s=cfg.raylet_rpc_timeout_ms / 1000,
        )
        virtual_clusters = VirtualClusterManager(
            store,
            self.clock,
            nodes,
            jobs,
            pgs,
            cache,
            publish=pubsub.control_plane.publish,
        )
        autoscaler.virtual_cluster_section = virtual_clusters.autoscaler_section
        poller = LoadPoller(
            nodes, cache, clients, self.clock, cfg.load_poll, on_report=health_checker.mark_healthy
        )
        # load -> repair -> serve
        await nodes.load()
        await pgs.load()
        await jobs.load()
        await autoscaler.load()
        await virtual_clusters.load()  # replays from the node table loaded above
        nodes.add_listener(virtual_clusters)  # after the NODE row is persisted, per event
        self.managers = Managers(
            kv,
            nodes,
            cache,
            pgs,
            jobs,
            autoscaler,
            health_checker,
            poller,
            clients,
            pubsub,
            virtual_clusters,
        )
        self._tune_gc()
        await self._start_grpc()
        await pubsub.start()
        if cfg.metrics_port >= 0:
            self.metrics_port = self.metrics.serve(cfg.host, cfg.metrics_port)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(poller.run(), name="load-poller"),
            loop.create_task(health_checker.run(), name="health-checker"),
            loop.create_task(self._refresh_metrics(), name="metrics"),
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
        if nodes.alive:
            self._tasks.append(
                loop.create_task(self._notify_restart(list(nodes.alive.values())), name="notify")
            )
        log.info(
            "gcs.started",
            address=self.address,
            storage=store.url,
            cluster_id=self.meta.cluster_id_hex,
            metrics_port=self.metrics_port,
            alive_nodes=len(nodes.alive),
            new_cluster=self.meta.created,
        )

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
        max_entries = cfg.max_map_entries
        server = grpc.aio.server(
            interceptors=[ClusterIdInterceptor(self.meta.cluster_id_hex)],
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
        servicers = [
            (
                svc.NODE_INFO,
                NodeInfoServicer(
                    m.nodes,
                    self.meta.cluster_id,
                    max_entries=max_entries,
                    virtual_cluster_nodes=m.virtual_clusters.node_filter,
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
            (svc.INTERNAL_KV, InternalKVServicer(m.kv)),
            (svc.AUTOSCALER_STATE, AutoscalerStateServicer(m.autoscaler, max_entries=max_entries)),
            (svc.JOB_INFO, JobInfoServicer(m.jobs)),
            (svc.PLACEMENT_GROUP_INFO, PlacementGroupInfoServicer(m.placement_groups)),
            (svc.VIRTUAL_CLUSTER_INFO, VirtualClusterInfoServicer(m.virtual_clusters)),
        ]
        for descriptor, servicer in servicers:
            server.add_generic_rpc_handlers([service_handler(descriptor, servicer, on_call=hook)])
        server.add_generic_rpc_handlers(m.pubsub.handlers(on_call=hook))
        servicers += [(svc.CONTROL_PLANE_PUBSUB, None), (svc.OBSERVABILITY_PUBSUB, None)]
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        names = [wire_service_name(d) for d, _ in servicers]
        for name in ["", *names]:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection(
            [*(d.full_name for d, _ in servicers), reflection.SERVICE_NAME, health.SERVICE_NAME],
            server,
        )
        self.port = server.add_insecure_port(f"{cfg.host}:{cfg.port}")
        if self.port == 0:
            raise OSError(f"could not bind {cfg.host}:{cfg.port}")
        await server.start()
        self._server = server

    async def _notify_restart(self, nodes: list) -> None:
        """Tell raylets known from the store that the GCS restarted (Ray does the same)."""
        assert self.managers is not None
        clients = self.managers.clients

        async def notify(node) -> None:  # type: ignore[no-untyped-def]
            address = f"{node.node_manager_address}:{node.node_manager_port}"
            with contextlib.suppress(grpc.aio.AioRpcError):
                await clients.get(node.node_id, address).node_manager.NotifyGCSRestart(
                    node_manager_pb2.NotifyGCSRestartRequest(), timeout=5
                )

        await asyncio.gather(*(notify(n) for n in nodes))

    async def _refresh_metrics(self) -> None:
        assert self.managers is not None
        m = self.managers
        while True:
            self.metrics.nodes.labels("ALIVE").set(len(m.nodes.alive))
            self.metrics.nodes.labels("DEAD").set(len(m.nodes.dead))
            self.metrics.poll_round_seconds.set(m.poller.stats.last_round_s)
            self.metrics.poll_staleness_seconds.set(m.poller.stats.max_staleness_s)
            self.metrics.poll_failures.set(m.poller.stats.polls_failed)
            self.metrics.poll_ok.set(m.poller.stats.polls_ok)
            self.metrics.health_failures.set(m.health.failures)
            self.metrics.pending_shapes.set(len(m.resources.demand))
            if self.gc_freezer is not None and self.gc_freezer.reclaim_if_grown():
                log.info("gc.reclaimed_frozen", resident_bytes=self.gc_freezer.baseline)
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
        if self.managers is not None:
            await self.managers.pubsub.stop()  # answer held long polls before the drain
        if self._server is not None:
            await self._server.stop(grace_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.managers is not None:
            await self.managers.virtual_clusters.close()
            await self.managers.health.close()
            await self.managers.clients.close()
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


class _DropClient:
    def __init__(self, clients: RayletClientPool) -> None:
        self._clients = clients

    def on_node_added(self, node: object) -> None:
        return None

    def on_node_dead(self, node) -> None:  # type: ignore[no-untyped-def]
        self._clients.drop(node.node_id)
