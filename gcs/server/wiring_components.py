"""The component list of one GCS (see :mod:`gcs.server.wiring`): serving, the head's
processes, the store and metrics, the GCS's own parts in load order, and the extras.

``load()`` runs in list order, ``run()`` all at once, ``close()`` in reverse order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from gcs import RAY_VERSION
from gcs.base.clock import Clock
from gcs.base.lifecycle import Component, Part
from gcs.config import GcsConfig
from gcs.managers.cluster_meta import ClusterIdentity
from gcs.managers.restart_notice import RestartNotice
from gcs.managers.task_failures import TaskFailureMarker
from gcs.managers.virtual_clusters import VirtualClusterManager
from gcs.rpc.security import Security
from gcs.rpc.server import CallHook
from gcs.rpc.warnings import WarningSampler
from gcs.server.event_stats import HandlerStats, print_periodically
from gcs.server.extras import Extras, autoscaler_component, demo_component
from gcs.server.families import gcs_families
from gcs.server.gc_policy import GcTuning
from gcs.server.head_processes import HeadChildren
from gcs.server.managers import Managers
from gcs.server.metrics import GcsMetrics, MetricSource, on_loop
from gcs.server.metrics_agent import MetricsAgentExporter
from gcs.server.ray_metrics import snapshot_of
from gcs.server.rpc_server import Prepared, RpcServer
from gcs.server.store_open import open_configured
from gcs.server.wiring_managers import Context, RayletIo
from gcs.store import Store
from gcs.store.metered import MeteredStore

__all__ = [
    "Built",
    "Serving",
    "extra_components",
    "gcs_components",
    "head_children",
    "serving",
    "store_and_metrics",
]


@dataclass(frozen=True, slots=True)
class Serving:
    rpc: RpcServer
    handler_stats: HandlerStats | None
    warnings: WarningSampler


@dataclass(frozen=True, slots=True)
class Built:
    managers: Managers
    identity: ClusterIdentity
    serving: Serving
    io: RayletIo
    task_failures: TaskFailureMarker
    gc: GcTuning
    children: HeadChildren


# -- serving and the head's processes ---------------------------------------------------------
def serving(
    ctx: Context,
    managers: Managers,
    identity: ClusterIdentity,
    metrics: GcsMetrics,
    advertised_host: str,
    admit: Callable[[], bool] | None,
    prepared: Prepared | None = None,
) -> Serving:
    cfg = ctx.cfg
    on_call: CallHook = metrics.on_call
    handler_stats: HandlerStats | None = None
    if cfg.event_stats and cfg.event_stats_print_interval_ms > 0:  # Ray's "Event stats" log
        handler_stats = HandlerStats()
        on_call = _both(metrics.on_call, handler_stats.on_call)
    rpc_warnings = WarningSampler(ctx.clock)  # repeated per-request warnings: counted, sampled
    rpc = RpcServer(
        cfg,
        managers,
        identity,
        ctx.security,
        ctx.clock,
        advertised_host=advertised_host,
        on_call=on_call,
        warnings=rpc_warnings,
        admit=admit,
        prepared=prepared,
    )
    return Serving(rpc, handler_stats, rpc_warnings)


def head_children(
    ctx: Context, identity: ClusterIdentity, rpc: RpcServer, advertised_host: str
) -> HeadChildren:
    cfg = ctx.cfg

    def advertised_address() -> str:
        return f"{advertised_host}:{rpc.port}"

    return HeadChildren(
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
        clock=ctx.clock,
    )


# -- components --------------------------------------------------------------------------------
def store_and_metrics(
    ctx: Context, store: Store, owns_store: bool, metrics: GcsMetrics, built: Built
) -> list[Component]:
    """Opening the store (a given store too: opening an open one is a no-op) and the
    figures read from their owners at scrape time, on the loop that owns them."""
    cfg = ctx.cfg
    sources: list[MetricSource] = []

    async def load_metrics() -> None:
        loop = asyncio.get_running_loop()
        sources.append(on_loop(loop, lambda: gcs_families(built.managers)))
        sources.append(on_loop(loop, built.serving.warnings.metric_families))
        for source in sources:
            metrics.add_source(source)
        if cfg.metrics_port >= 0:
            metrics.serve(cfg.host, cfg.metrics_port)

    async def close_metrics() -> None:
        for source in sources:  # this wiring's managers are gone (an HA term ended)
            metrics.remove_source(source)
        if cfg.metrics_port >= 0:
            metrics.close()

    async def open_store() -> None:
        await open_configured(store, ctx.clock, cfg)

    async def close_store() -> None:
        if owns_store:
            await store.close()

    return [
        Part("store", load=open_store, close=close_store),
        Part("metrics", load=load_metrics, close=close_metrics),
    ]


def gcs_components(
    ctx: Context, b: Built, metrics: GcsMetrics, advertised_host: str
) -> list[Component]:
    """The GCS itself: load in dependency order, run together, serve, tell the raylets."""
    cfg, clock, m, rpc = ctx.cfg, ctx.clock, b.managers, b.serving.rpc

    def once_serving(run: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """Raylets are reached only once the GCS answers them (load -> serve -> reach)."""

        async def go() -> None:
            await rpc.serving()
            await run()

        return go

    return [
        Part("raylets", close=b.io.raylets.close),
        Part("actor_io", close=b.io.actors.close),
        b.identity,
        Part("nodes", load=m.nodes.load),
        Part("placement_groups", load=m.placement_groups.load),
        Part("jobs", load=m.jobs.load, close=m.jobs.close),
        Part("workers", load=m.workers.load),
        Part("autoscaler_state", load=m.autoscaler.load),
        Part(  # replays from the node table loaded above; periodic passes on the clock
            "virtual_clusters",
            load=m.virtual_clusters.load,
            run=lambda: _virtual_cluster_loops(m.virtual_clusters, cfg),
            close=m.virtual_clusters.close,
        ),
        Part("actors", load=m.actors.load, close=m.actors.close),  # after nodes: dead owners
        Part("task_failures", close=b.task_failures.close),
        Part("load_poller", run=once_serving(m.poller.run)),
        Part("health", run=once_serving(m.health.run), close=m.health.close),
        Part("pg_scheduler", run=once_serving(m.pg_scheduler.run), close=m.pg_scheduler.close),
        Part("runtime_envs", run=m.runtime_envs.run),
        Part("pubsub", run=m.pubsub.run, close=m.pubsub.stop),
        Part("event_stats", run=_event_stats_printer(b.serving.handler_stats, clock, cfg)),
        *_metrics_agent(cfg, m, ctx.store, clock, ctx.security, advertised_host),
        b.gc,  # after every load: freezes what start-up loaded
        rpc,
        RestartNotice(
            m.nodes,
            m.poller,
            m.raylets,
            m.actors,
            clock,
            contacts_per_s=cfg.raylet_io.startup_contacts_per_s,
            max_concurrent=cfg.health.max_concurrent,
            serving=rpc.serving,
        ),
        b.children,
    ]


def extra_components(
    ctx: Context, extras: Extras, store: Store, metrics: GcsMetrics, rpc: RpcServer
) -> list[Component]:
    """What ``gcs serve`` runs beside the GCS (its clients, started once it serves)."""
    cfg = ctx.cfg

    def bind_address() -> str:
        return f"{cfg.host}:{rpc.port}"

    out: list[Component] = []
    if extras.autoscaler is not None:
        out.append(
            autoscaler_component(
                extras.autoscaler,
                gcs_address=bind_address,
                store=store,
                security=ctx.security,
                data_dir=cfg.data_dir,
                metrics=metrics,
                clock=ctx.clock,
                serving=rpc.serving,
            )
        )
    if extras.demo_nodes:
        out.append(
            demo_component(
                extras.demo_nodes,
                gcs_address=bind_address,
                security=ctx.security,
                agents=extras.autoscaler is None,  # else the autoscaler's provider runs them
                serving=rpc.serving,
            )
        )
    return out


async def _virtual_cluster_loops(virtual_clusters: VirtualClusterManager, cfg: GcsConfig) -> None:
    await _all(
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
    )


async def _all(*loops: Awaitable[None]) -> None:
    """Run loops together; the first to fail cancels the others and is raised."""
    async with asyncio.TaskGroup() as group:
        for loop in loops:
            group.create_task(loop)  # type: ignore[arg-type]


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
