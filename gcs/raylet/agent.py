"""A lightweight raylet: serves NodeManagerService + gRPC health, registers with a GCS.

Lifecycle (``start`` → ``wait`` → ``stop``; ``stop`` is idempotent):

1. Bind a grpc.aio server on ``host:port`` serving ``ray.rpc.NodeManagerService`` and
   ``grpc.health.v1.Health`` (service ``""`` and ``<node id hex>`` → SERVING).
2. ``GetClusterId`` without metadata, then every call carries ``ray_cluster_id``;
   ``RegisterNode`` with a full ``GcsNodeInfo``.
3. Every ``liveness_check_interval_ms`` (Ray's ``raylet_liveness_self_check_interval_ms``,
   60 s) ``CheckAlive`` with our id.  ``raylet_alive=false`` → exit ``DECLARED_DEAD`` (Ray
   semantics) unless ``reregister_when_dead``.

Reconnection policy (our decision; Ray's raylet never re-registers): when the GCS is
unreachable the agent retries ``GetClusterId`` with capped exponential backoff.  When it
answers with the *same* cluster id (a persistent GCS came back) the agent calls
``RegisterNode`` again — idempotent for the same node id on our GCS, and it restores the
node if the GCS lost it.  A *different* cluster id means a new, non-persistent GCS: the
agent fate-shares (exit ``CLUSTER_CHANGED``) unless ``rejoin_new_cluster``, in which case it
registers with the new cluster.  ``NotifyGCSRestart`` triggers the same check at once.

Giving up (Ray's ``gcs_rpc_server_reconnect_timeout_s``, 60 s): once the GCS has been
unreachable that long -- measured on the injected clock from the first failed call of the
outage -- the agent exits ``GCS_UNREACHABLE``, as Ray's raylet does ("Failed to connect to
GCS within 60 seconds"), so agents never outlive a GCS that is gone.  The syncer stream
breaking with the GCS (UNAVAILABLE) triggers a liveness check at once, so an outage is
noticed within a second or so, not at the next ``liveness_check_interval_ms``.
"""

from __future__ import annotations

import asyncio
import enum
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gcs.base.background import Background
from gcs.base.changes import Changes
from gcs.base.clock import Clock, SystemClock, now_ms, wait_event
from gcs.base.pubsub_channels import RAY_VIRTUAL_CLUSTER_CHANNEL
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2, pubsub_pb2, virtual_cluster_pb2
from gcs.raylet import convert
from gcs.raylet.resources import LocalResources
from gcs.raylet.servicer import NodeIdentity, NodeManagerServicer
from gcs.raylet.sync_link import SyncerLink
from gcs.raylet.vc_view import VirtualClusterView
from gcs.rpc import ServiceStub, service_handler
from gcs.rpc.descriptors import NODE_INFO, NODE_MANAGER, VIRTUAL_CLUSTER_INFO
from gcs.rpc.interceptors import CallGuardInterceptor
from gcs.rpc.security import Security
from gcs.sdk._subscriber import GcsSubscriber, SubscribeError

log = structlog.get_logger("gcs.raylet")

CLUSTER_ID_METADATA_KEY = "ray_cluster_id"
UNREGISTER_TIMEOUT_S = 5.0
"""Leaving must not hang on an unreachable GCS."""
_GCS_DOWN = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


class _HealthServicer(health.aio.HealthServicer):
    """grpc's health servicer, counting the checks the GCS makes (benchmarks compare GCSs
    by the RPCs they cost a raylet)."""

    checks = 0

    async def Check(self, request: Any, context: Any) -> Any:
        self.checks += 1
        return await super().Check(request, context)


class ExitReason(enum.Enum):
    STOPPED = "stopped"
    """``stop()`` was called by the owner."""
    DRAINED_IDLE = "drained_idle"
    """An IDLE_TERMINATION drain was accepted; the node unregistered itself."""
    SHUTDOWN_REQUESTED = "shutdown_requested"
    """``ShutdownRaylet`` was called."""
    DECLARED_DEAD = "declared_dead"
    """``CheckAlive`` said this node is dead."""
    CLUSTER_CHANGED = "cluster_changed"
    """The GCS came back with a different cluster id (fate-sharing)."""
    GCS_UNREACHABLE = "gcs_unreachable"
    """The GCS was unreachable for ``gcs_rpc_server_reconnect_timeout_s`` (Ray's raylet
    exits then too)."""


@dataclass(frozen=True)
class RayletConfig:
    gcs_address: str
    """``host:port`` of the GCS."""
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0})
    node_type: str = ""
    """Reported as ``GcsNodeInfo.node_type_name``."""
    labels: dict[str, str] = field(default_factory=dict)
    node_id: bytes | None = None
    """28 bytes; random when not given."""
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port."""
    node_name: str = ""
    """Defaults to ``host``."""
    instance_id: str = ""
    is_head: bool = False
    liveness_check_interval_ms: int = 60_000
    rpc_timeout_s: float = 10.0
    reconnect_backoff_initial_ms: int = 200
    reconnect_backoff_max_ms: int = 5_000
    gcs_rpc_server_reconnect_timeout_s: float = 60.0
    """Ray's knob and default: exit ``GCS_UNREACHABLE`` once the GCS has been unreachable
    this long (0: at the first failed reconnect attempt).  The first registration is bounded
    by ``register_timeout_s`` instead."""
    register_timeout_s: float = 30.0
    """How long ``start()`` keeps retrying the first registration."""
    rejoin_new_cluster: bool = False
    reregister_when_dead: bool = False
    worker_port: int = 0
    """Port of the core worker every granted lease names (:class:`NodeIdentity`)."""
    syncer: bool = True
    """Open Ray's syncer stream (``RaySyncer/StartSync``) and send the resource view on
    change, as a 2.60 raylet does (:mod:`gcs.raylet.sync_link`)."""
    subscribe_virtual_clusters: bool = True
    """Keep a view of indivisible virtual clusters from pubsub channel 11 (fleets turn it
    off: 2,000 long polls from one process cost more than the fleet itself)."""


class RayletAgent:
    """One synthetic raylet.  ``gcs_channel`` lets a fleet share one channel to the GCS."""

    def __init__(
        self,
        config: RayletConfig,
        *,
        clock: Clock | None = None,
        gcs_channel: grpc.aio.Channel | None = None,
        security: Security | None = None,
    ) -> None:
        """``security`` (token, TLS) defaults to Ray's environment (:class:`Security`): the
        agent sends the token to the GCS and requires it from its own callers."""
        node_id = config.node_id if config.node_id is not None else os.urandom(28)
        if len(node_id) != 28:
            raise ValueError("node_id must be 28 bytes")
        self.config = config
        self.node_id = node_id
        self._clock = clock or SystemClock()
        self.security = security if security is not None else Security.from_env()
        self._own_channel = gcs_channel is None
        self._channel = gcs_channel
        labels = {**config.labels, convert.NODE_ID_LABEL: node_id.hex()}
        self.resources = LocalResources(total=dict(config.resources), labels=labels)
        self._server: grpc.aio.Server | None = None
        self._health: _HealthServicer | None = None
        self.servicer: NodeManagerServicer | None = None
        self.port = 0
        self.cluster_id: bytes | None = None
        self.registrations = 0
        self.gcs_connected = False
        """False from the moment a GCS call fails as unreachable until re-registration."""
        self.changes = Changes()
        """Notified when the link to the GCS changes (registered, lost) and on exit."""
        self._start_time_ms = 0
        self._stub: ServiceStub | None = None
        self._bare_stub: ServiceStub | None = None
        self._wake = asyncio.Event()
        self._reconnect = False
        """Set with ``_wake`` when the link must reconnect (not only check liveness)."""
        self._unreachable_since: float | None = None
        """Monotonic time of the first failed GCS call of the current outage."""
        self.exit_message = ""
        """Why the agent exited, in one sentence (set for the fatal exits)."""
        self._stopped = asyncio.Event()
        self._exit: ExitReason | None = None
        self._tasks = Background("raylet")
        self._link: asyncio.Task[None] | None = None
        self.virtual_clusters = VirtualClusterView()
        self._vc_subscriber: GcsSubscriber | None = None
        self.syncer: SyncerLink | None = None

    # -- public --------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def health_checks(self) -> int:
        """``grpc.health.v1`` checks answered."""
        return self._health.checks if self._health is not None else 0

    @property
    def exit_reason(self) -> ExitReason | None:
        return self._exit

    async def start(self) -> None:
        """Serve, then register (retrying up to ``register_timeout_s``)."""
        await self.serve()
        try:
            await asyncio.wait_for(self._connect(first=True), self.config.register_timeout_s)
        except BaseException:
            await self.stop()
            raise
        self._link = asyncio.get_running_loop().create_task(self._run_link())
        if self.config.syncer:
            self._start_syncer()
        if self.config.subscribe_virtual_clusters:
            self._tasks.spawn(self._subscribe_virtual_clusters(), "vc-subscribe")

    async def serve(self) -> None:
        """Only the server half (fleets start servers first, then register in bulk)."""
        if self._server is not None:
            return
        token = self.security.token
        interceptors = [CallGuardInterceptor(None, token)] if token is not None else []
        server = grpc.aio.server(interceptors=interceptors, options=[("grpc.so_reuseport", 0)])
        self.port = self.security.add_port(server, f"{self.config.host}:{self.config.port}")
        identity = NodeIdentity(self.node_id, self.config.host, self.port, self.config.worker_port)
        self.servicer = NodeManagerServicer(identity, self.resources, self, self._clock)
        server.add_generic_rpc_handlers((service_handler(NODE_MANAGER, self.servicer),))
        self._health = _HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(self.node_id.hex(), health_pb2.HealthCheckResponse.SERVING)
        await server.start()
        self._server = server
        self._start_time_ms = now_ms(self._clock)

    async def wait(self) -> ExitReason:
        await self._stopped.wait()
        assert self._exit is not None
        return self._exit

    async def stop(self, reason: ExitReason = ExitReason.STOPPED, grace_s: float = 0.5) -> None:
        if self._exit is not None:
            await self._stopped.wait()
            return
        self._exit = reason
        current = asyncio.current_task()
        for task in [self._link, *self._tasks.tasks]:
            if task is not None and task is not current:
                task.cancel()
        if self._vc_subscriber is not None:
            await self._vc_subscriber.close()
        if self.servicer is not None:
            self.servicer.close()
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace_s)
        if self._own_channel and self._channel is not None:
            await self._channel.close()
        log.info("raylet.stopped", node_id=self.node_id.hex(), reason=reason.value)
        self._stopped.set()
        self.changes.notify()

    async def leave(self, reason_message: str = "raylet stopped by a signal") -> None:
        """Unregister (EXPECTED_TERMINATION), then stop: a signalled raylet leaves cleanly
        instead of being found dead by health checks later."""
        if self._exit is not None or self.cluster_id is None:
            await self.stop()
            return
        death = common_pb2.NodeDeathInfo(
            reason=common_pb2.NodeDeathInfo.EXPECTED_TERMINATION, reason_message=reason_message
        )
        await self._unregister_and_stop(death, ExitReason.STOPPED)

    def node_info(self) -> gcs_pb2.GcsNodeInfo:
        cfg = self.config
        return gcs_pb2.GcsNodeInfo(
            node_id=self.node_id,
            node_manager_address=cfg.host,
            node_manager_port=self.port,
            object_manager_port=self.port,
            node_manager_hostname=socket.gethostname(),
            resources_total=self.resources.total,
            node_name=cfg.node_name or cfg.host,
            instance_id=cfg.instance_id,
            node_type_name=cfg.node_type,
            start_time_ms=self._start_time_ms,
            is_head_node=cfg.is_head,
            labels=self.resources.labels,
            state=gcs_pb2.GcsNodeInfo.ALIVE,
        )

    # -- AgentControl (called by the servicer) -------------------------------------------

    def on_idle_drain_accepted(self, reason_message: str) -> None:
        death = common_pb2.NodeDeathInfo(
            reason=common_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_IDLE, reason_message=reason_message
        )
        self._tasks.spawn(self._unregister_and_stop(death, ExitReason.DRAINED_IDLE), "leave")

    def on_shutdown_requested(self, graceful: bool) -> None:
        death = common_pb2.NodeDeathInfo(
            reason=common_pb2.NodeDeathInfo.EXPECTED_TERMINATION,
            reason_message="ShutdownRaylet was called",
        )
        self._tasks.spawn(self._unregister_and_stop(death, ExitReason.SHUTDOWN_REQUESTED), "leave")

    def on_gcs_restarted(self) -> None:
        self._reconnect = True
        self._wake.set()

    def _on_syncer_ended(self, code: grpc.StatusCode) -> None:
        """The syncer stream broke: if the GCS looks gone, check liveness now (the outage
        clock starts at the first failed call, not at the next periodic check)."""
        if code in _GCS_DOWN and self._exit is None:
            self._wake.set()

    def on_view_changed(self) -> None:
        if self.syncer is not None:
            self.syncer.changed()

    # -- syncer --------------------------------------------------------------------------

    def _start_syncer(self) -> None:
        assert self._channel is not None and self.servicer is not None
        assert self.cluster_id is not None
        self.syncer = SyncerLink(
            self.node_id,
            self._channel,
            self.servicer.resource_view,
            metadata=((CLUSTER_ID_METADATA_KEY, self.cluster_id.hex()),),
            backoff_initial_s=self.config.reconnect_backoff_initial_ms / 1000,
            backoff_max_s=self.config.reconnect_backoff_max_ms / 1000,
            clock=self._clock,
            on_ended=self._on_syncer_ended,
        )
        self._tasks.spawn(self.syncer.run(), "syncer")

    # -- virtual clusters (pubsub channel 11) --------------------------------------------

    async def _subscribe_virtual_clusters(self) -> None:
        """Subscribe, then fetch the snapshot; refetch whenever the publisher restarts."""
        assert self._channel is not None and self.cluster_id is not None
        metadata = [(CLUSTER_ID_METADATA_KEY, self.cluster_id.hex())]
        subscriber = GcsSubscriber(
            self._channel,
            on_message=self._on_vc_message,
            on_publisher_restart=self._refetch_virtual_clusters,
            metadata=metadata,
        )
        self._vc_subscriber = subscriber
        await subscriber.start()
        try:
            await subscriber.subscribe(RAY_VIRTUAL_CLUSTER_CHANNEL)
        except SubscribeError as err:
            # A GCS without virtual clusters (e.g. Ray's own) refuses channel 11: run without.
            log.debug("raylet.vc_unavailable", code=err.code.name, details=err.details)
            await subscriber.close()
            self._vc_subscriber = None
            return
        await self._refetch_virtual_clusters(b"")

    def _on_vc_message(self, message: pubsub_pb2.PubMessage) -> None:
        if message.HasField("virtual_cluster_message"):
            self.virtual_clusters.apply(message.virtual_cluster_message)

    async def _refetch_virtual_clusters(self, publisher_id: bytes) -> None:
        assert self._channel is not None and self.cluster_id is not None
        stub = ServiceStub(
            self._channel,
            VIRTUAL_CLUSTER_INFO,
            metadata=[(CLUSTER_ID_METADATA_KEY, self.cluster_id.hex())],
            timeout_s=self.config.rpc_timeout_s,
        )
        try:
            reply = await stub.GetVirtualClusters(
                virtual_cluster_pb2.GetVirtualClustersRequest(
                    include_job_clusters=True, only_include_indivisible_clusters=True
                )
            )
        except grpc.aio.AioRpcError as err:
            # the GCS being down is the link's business (it reconnects or gives up)
            level = log.info if err.code() in _GCS_DOWN else log.warning
            level("raylet.vc_refetch_failed", code=err.code().name)
            return
        self.virtual_clusters.replace_all(reply.virtual_cluster_data_list)
        log.info("raylet.vc_view_refreshed", clusters=len(self.virtual_clusters.clusters))

    # -- GCS link ------------------------------------------------------------------------

    def _stubs(self) -> tuple[ServiceStub, ServiceStub]:
        if self._stub is None or self._bare_stub is None:
            if self._channel is None:
                self._channel = self.security.aio_channel(self.config.gcs_address)
            timeout = self.config.rpc_timeout_s
            self._bare_stub = ServiceStub(self._channel, NODE_INFO, timeout_s=timeout)
            self._stub = ServiceStub(self._channel, NODE_INFO, timeout_s=timeout)
        return self._bare_stub, self._stub

    async def _connect(self, *, first: bool) -> None:
        """GetClusterId (retrying while the GCS is down), check it, RegisterNode."""
        bare, stub = self._stubs()
        backoff_ms = self.config.reconnect_backoff_initial_ms
        while True:
            try:
                reply = await bare.GetClusterId(gcs_service_pb2.GetClusterIdRequest())
                break
            except grpc.aio.AioRpcError as err:
                if err.code() not in _GCS_DOWN:
                    raise
                self.gcs_connected = False
                self.changes.notify()
                log.info("raylet.gcs_unreachable", node_id=self.node_id.hex(), code=err.code())
                left_s = None if first else self._outage_left_s()
                if left_s is not None and left_s <= 0:
                    await self._give_up(err)
                    return
                delay_s = backoff_ms / 1000
                await self._clock.sleep(delay_s if left_s is None else min(delay_s, left_s))
                backoff_ms = min(backoff_ms * 2, self.config.reconnect_backoff_max_ms)
        self._unreachable_since = None
        cluster_id = reply.cluster_id
        if not first and cluster_id != self.cluster_id and not self.config.rejoin_new_cluster:
            self.exit_message = (
                f"the GCS at {self.config.gcs_address} came back as a new cluster "
                f"({cluster_id.hex()[:12]}...); this raylet belonged to the old one "
                "(--rejoin-new-cluster joins the new one instead)"
            )
            log.info(
                "raylet.cluster_changed",
                node_id=self.node_id.hex(),
                old=(self.cluster_id or b"").hex(),
                new=cluster_id.hex(),
            )
            await self.stop(ExitReason.CLUSTER_CHANGED)
            return
        self.cluster_id = cluster_id
        stub.set_metadata([(CLUSTER_ID_METADATA_KEY, cluster_id.hex())])
        await stub.RegisterNode(gcs_service_pb2.RegisterNodeRequest(node_info=self.node_info()))
        self.registrations += 1
        self.gcs_connected = True
        self.changes.notify()
        log.info("raylet.registered", node_id=self.node_id.hex(), address=self.address)

    def _outage_left_s(self) -> float:
        """Seconds left of ``gcs_rpc_server_reconnect_timeout_s`` in this outage (its clock
        starts now if this is its first failed call)."""
        now = self._clock.monotonic_s()
        if self._unreachable_since is None:
            self._unreachable_since = now
        elapsed = now - self._unreachable_since
        return self.config.gcs_rpc_server_reconnect_timeout_s - elapsed

    async def _give_up(self, err: grpc.aio.AioRpcError) -> None:
        timeout_s = self.config.gcs_rpc_server_reconnect_timeout_s
        self.exit_message = (
            f"the GCS at {self.config.gcs_address} has been unreachable for {timeout_s:g} s "
            f"({err.code().name}); giving up (gcs_rpc_server_reconnect_timeout_s, as Ray's "
            "raylet does)"
        )
        log.info("raylet.gcs_gone", node_id=self.node_id.hex(), timeout_s=timeout_s)
        await self.stop(ExitReason.GCS_UNREACHABLE)

    async def _run_link(self) -> None:
        """Liveness self-check every interval of the injected clock, or at once when woken
        (the syncer stream broke); reconnect/re-register when the GCS restarts."""
        interval_s = self.config.liveness_check_interval_ms / 1000
        while self._exit is None:
            await wait_event(self._clock, self._wake, interval_s)
            if self._exit is not None:
                return
            try:
                if self._wake.is_set():
                    self._wake.clear()
                    if self._reconnect:
                        self._reconnect = False
                        await self._connect(first=False)
                        continue
                await self._check_alive()
            except grpc.aio.AioRpcError as err:
                # e.g. RegisterNode refused mid-reconnect: try the whole reconnect again
                log.warning("raylet.link_error", code=err.code(), details=err.details())
                await self._clock.sleep(self.config.reconnect_backoff_initial_ms / 1000)
                self._reconnect = True
                self._wake.set()

    async def _check_alive(self) -> None:
        _, stub = self._stubs()
        try:
            reply = await stub.CheckAlive(
                gcs_service_pb2.CheckAliveRequest(node_ids=[self.node_id])
            )
        except grpc.aio.AioRpcError as err:
            if err.code() in _GCS_DOWN or err.code() == grpc.StatusCode.UNAUTHENTICATED:
                self.gcs_connected = False
                self.changes.notify()
                if err.code() in _GCS_DOWN:
                    self._outage_left_s()  # the outage began at this call
                await self._connect(first=False)
                return
            log.warning("raylet.check_alive_failed", code=err.code(), details=err.details())
            return
        if reply.raylet_alive and reply.raylet_alive[0]:
            return
        if self.config.reregister_when_dead:
            await self._connect(first=False)
            return
        self.exit_message = (
            f"the GCS at {self.config.gcs_address} says node {self.node_id.hex()} is dead "
            "(it missed its health checks or was removed)"
        )
        log.info("raylet.declared_dead", node_id=self.node_id.hex())
        await self.stop(ExitReason.DECLARED_DEAD)

    async def _unregister_and_stop(
        self, death: common_pb2.NodeDeathInfo, reason: ExitReason
    ) -> None:
        await asyncio.sleep(0)  # let the accepting reply go out first
        _, stub = self._stubs()
        try:
            await stub.UnregisterNode(
                gcs_service_pb2.UnregisterNodeRequest(node_id=self.node_id, node_death_info=death),
                timeout=min(self.config.rpc_timeout_s, UNREGISTER_TIMEOUT_S),
            )
        except grpc.aio.AioRpcError as err:
            log.warning("raylet.unregister_failed", code=err.code(), details=err.details())
        await self.stop(reason)
