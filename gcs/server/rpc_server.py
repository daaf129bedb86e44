"""The GCS port as a component: every servicer, health and reflection, on grpc.aio alone or
behind the front server (:mod:`gcs.front`).

``run()`` builds the handler table, binds the port, marks itself serving and waits;
``close()`` drains: GOAWAY first (no new streams, so answered long polls are not re-held),
then the pubsub publishers answer their held polls, then open streams finish within the
grace period.  Nothing is bound before ``run()``: a loaded, not running GCS (a standby)
serves nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import random
import shutil
import tempfile
from collections.abc import Callable

import grpc
import structlog
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from gcs.base.background import Background
from gcs.base.clock import Clock, now_ms, within
from gcs.base.handler_delays import HandlerDelays, Pause
from gcs.config import GcsConfig, kv_put_request_bytes
from gcs.front import (
    ByteBudget,
    Forwarder,
    FrontServer,
    GrpcRouter,
    h2_limits,
    hot_methods,
    native_methods,
    serves,
)
from gcs.front.sync import SyncDispatcher
from gcs.managers.cluster_meta import ClusterIdentity
from gcs.managers.head import virtual_head
from gcs.proto import gcs_pb2
from gcs.rpc import descriptors as svc
from gcs.rpc import method_path, service_handler, wire_service_name
from gcs.rpc.interceptors import HEALTH_PREFIX, CallGuard, CallGuardInterceptor
from gcs.rpc.security import Security
from gcs.rpc.server import LONG_POLL_SERVER_OPTIONS, CallHook, HandlerTable
from gcs.rpc.warnings import WarningSampler
from gcs.server.ha_steps import Steps
from gcs.server.managers import Managers
from gcs.server.reflection import wire_pool
from gcs.services.actors import ActorInfoServicer
from gcs.services.autoscaler import AutoscalerStateServicer
from gcs.services.jobs_pgs import JobInfoServicer, PlacementGroupInfoServicer
from gcs.services.kv import InternalKVServicer
from gcs.services.node_info import NodeInfoServicer
from gcs.services.node_resources import NodeResourceInfoServicer
from gcs.services.pubsub import PubSubServicer
from gcs.services.ray_syncer import RaySyncerServicer, StartSync
from gcs.services.virtual_clusters import VirtualClusterInfoServicer
from gcs.services.workers_tasks import RuntimeEnvServicer, TaskInfoServicer, WorkerInfoServicer

__all__ = ["Prepared", "RpcServer", "port_in_use"]

log = structlog.get_logger("gcs.rpc")

CLUSTER_WAITS = frozenset(
    {
        method_path(svc.ACTOR_INFO.methods_by_name["CreateActor"]),
        method_path(svc.PLACEMENT_GROUP_INFO.methods_by_name["WaitPlacementGroupUntilReady"]),
    }
)
"""Calls answered when the cluster changes (an actor created, a group placed), not when
the GCS is done: a planned handover does not wait for them.  They end with the term
(UNAVAILABLE, as at any stop; Ray's clients send them again, and the successor, which
loads the actor or group still pending, answers)."""

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"]
_GRPC_OPTIONS = (
    ("grpc.keepalive_time_ms", 10000),
    ("grpc.keepalive_timeout_ms", 20000),
    *LONG_POLL_SERVER_OPTIONS,
)


REFLECTED = (
    *svc.SERVED_BY_GCS,
    reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
    HEALTH_SERVICE,
)
"""What reflection lists: every service served (Ray's ray.rpc.* names, see
gcs.server.reflection), reflection and health."""


@dataclasses.dataclass(frozen=True, slots=True)
class Prepared:
    """What the RPC server builds that depends on neither the lease nor the state: an HA
    standby builds it while it waits (``GcsServer``), so that each of its terms reuses it
    instead of building it between taking the lease and serving (a planned handover's
    pause).  Read-only once built; it answers nothing (a standby serves no call)."""

    reflection_pool: DescriptorPool

    @classmethod
    def build(cls) -> Prepared:
        return cls(reflection_pool=wire_pool(REFLECTED))

    @classmethod
    def ahead(cls) -> Prepared:
        """Built by a standby: also a throwaway grpc.aio server, never bound nor started
        (the first one of a process costs ~10 ms of gRPC's own set-up, off the takeover)."""
        grpc.aio.server()
        return cls.build()


class PreparedAhead:
    """An HA member's :class:`Prepared`: built once by its standby (:meth:`build`, off the
    takeover), reused by each of its terms (:attr:`parts`; None before)."""

    def __init__(self) -> None:
        self.parts: Prepared | None = None

    def build(self) -> None:
        if self.parts is None:
            self.parts = Prepared.ahead()


def port_in_use(host: str, port: int) -> OSError:
    return OSError(errno.EADDRINUSE, f"cannot bind the gRPC port {host}:{port} (in use?)")


class RpcServer:
    name = "rpc"

    def __init__(
        self,
        config: GcsConfig,
        managers: Managers,
        identity: ClusterIdentity,
        security: Security,
        clock: Clock,
        *,
        advertised_host: str,
        on_call: CallHook,
        warnings: WarningSampler,
        admit: Callable[[], bool] | None = None,
        prepared: Prepared | None = None,
    ) -> None:
        """``admit`` (``--ha``): whether this GCS may still answer as the leader, asked per
        call (``gcs.server.ha``); with it the port is bound SO_REUSEPORT, shared with the
        other members of the group on this host.  ``prepared``: built ahead (else here)."""
        self._admit = admit
        self.prepared = prepared
        self._config = config
        self._warnings = warnings
        self._m = managers
        self._identity = identity
        self._security = security
        self._clock = clock
        self._advertised_host = advertised_host
        self._on_call = on_call
        self.port = 0
        self._serving = asyncio.Event()
        self._stopped = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        self.front: FrontServer | None = None
        self._private_dir = ""
        self._closed = False
        self._background = Background("rpc")
        """The port's own tasks (grpc.aio's syncer readers, the front's blocked-peer retry)."""
        self._start_sync: StartSync | None = None
        self.grace_s = 2.0
        """How long open streams may take to finish at close (``GcsServer.stop``)."""
        self.steps = Steps(clock)
        """``run()``'s steps to serving (an HA takeover logs them: :mod:`.ha_steps`)."""

    async def serving(self) -> None:
        """Returns once the port accepts calls."""
        await self._serving.wait()

    @property
    def is_serving(self) -> bool:
        return self._serving.is_set()

    @property
    def internal_address(self) -> str | None:
        """grpc.aio's own address behind the front server (a Unix socket); None when grpc.aio
        alone serves the port.  Both transports answer there from the same handlers."""
        if self.front is None or not self._private_dir:
            return None
        return f"unix:{self._private_dir}/grpc.sock"

    async def load(self) -> None:
        return None

    async def run(self) -> None:
        cfg = self._config
        self.steps.mark("rpc_run")
        interceptor = CallGuardInterceptor(
            self._identity.meta.cluster_id_hex, self._security.token, admit=self._admit
        )
        server = grpc.aio.server(
            interceptors=[interceptor],
            options=[
                ("grpc.max_receive_message_length", cfg.grpc_max_message_bytes),
                ("grpc.max_send_message_length", cfg.grpc_max_message_bytes),
                *_GRPC_OPTIONS,
                # --ha on grpc.aio alone: the group's members on this host share the port
                ("grpc.so_reuseport", int(self._admit is not None)),
            ],
        )
        self._server = server
        table = HandlerTable(server)
        pubsub_servicers = await self._register(table)
        self.steps.mark("registered")
        if cfg.front_server:
            await self._serve_behind_front(table, interceptor.guard, pubsub_servicers)
        else:
            try:
                self.port = self._security.add_port(server, f"{cfg.host}:{cfg.port}")
            except RuntimeError:  # grpc's "Failed to bind to address ..."
                self.port = 0
            if self.port == 0:
                raise port_in_use(cfg.host, cfg.port)
            await server.start()
        self.steps.mark("bound")
        self._serving.set()
        await self._stopped.wait()

    async def _register(
        self, table: HandlerTable
    ) -> list[tuple[ServiceDescriptor, PubSubServicer]]:
        """Every servicer on ``table``, health SERVING for each, reflection listing them."""
        m, cfg = self._m, self._config
        limits = dataclasses.replace(  # no reply is built past what gRPC may send
            cfg.limits, max_reply_bytes=min(cfg.limits.max_reply_bytes, cfg.grpc_max_message_bytes)
        )
        servicers: list[tuple[ServiceDescriptor, object]] = [
            (
                svc.NODE_INFO,
                NodeInfoServicer(
                    m.nodes,
                    self._identity.meta.cluster_id,
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
                    limits=limits,
                ),
            ),
            (
                svc.INTERNAL_KV,
                InternalKVServicer(
                    m.kv,
                    limits=limits,
                    internal_config=json.loads(cfg.ray_internal_config or "null"),
                ),
            ),
            (svc.AUTOSCALER_STATE, AutoscalerStateServicer(m.autoscaler, limits=limits)),
            (svc.JOB_INFO, JobInfoServicer(m.jobs, m.job_view, limits=limits)),
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
        delays = HandlerDelays.parse(cfg.testing_asio_delay_us)  # checked by config.validate
        rng = random.Random()

        def pauses(service: str, method: str) -> Pause | None:
            return delays.pause_for(service, method, self._clock.sleep, rng)

        for descriptor, servicer in servicers:
            handler = service_handler(
                descriptor,
                servicer,
                on_call=self._on_call,
                max_request_bytes=limits.max_request_bytes,
                max_request_bytes_by_method=by_method,
                warnings=self._warnings,
                pauses=pauses,
            )
            table.add_generic_rpc_handlers([handler])
        pubsub_servicers = m.pubsub.servicers(limits)
        table.add_generic_rpc_handlers(
            m.pubsub.handlers(on_call=self._on_call, limits=limits, servicers=pubsub_servicers)
        )
        self._start_sync = StartSync(
            m.syncer, limits, on_call=self._on_call, warnings=self._warnings
        )
        syncer = RaySyncerServicer(self._start_sync, self._background)
        table.add_generic_rpc_handlers([syncer.handler()])
        served = [
            *(d for d, _ in servicers),
            svc.CONTROL_PLANE_PUBSUB,
            svc.OBSERVABILITY_PUBSUB,
            svc.RAY_SYNCER,
        ]
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, table)
        names = [wire_service_name(d) for d in served]
        for name in ["", *names]:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        prepared = self.prepared if self.prepared is not None else Prepared.build()
        reflection.enable_server_reflection(
            [*names, reflection.SERVICE_NAME, health.SERVICE_NAME],
            table,
            pool=prepared.reflection_pool,
        )
        return pubsub_servicers

    async def _serve_behind_front(
        self,
        table: HandlerTable,
        guard: CallGuard,
        pubsub_servicers: list[tuple[ServiceDescriptor, PubSubServicer]],
    ) -> None:
        """grpc.aio on a private Unix socket (plaintext: the hop never leaves the host, the
        directory is the owner's only); the front server on the GCS port (gcs.front)."""
        cfg = self._config
        server = table.server
        # one mkdir (~0.2 ms), on the loop: a hop to a worker thread costs milliseconds on
        # a busy host (the first one of a process ~10 ms), on a takeover's path to serving
        self._private_dir = tempfile.mkdtemp(prefix="gcs", dir="/tmp")
        internal = f"unix:{self._private_dir}/grpc.sock"
        if server.add_insecure_port(internal) == 0:
            raise OSError(errno.EADDRINUSE, f"cannot bind the internal gRPC socket {internal}")
        await server.start()
        self.steps.mark("inner_started")
        paths = [
            *(method_path(method) for d in svc.SERVED_BY_GCS for method in d.methods),
            *(HEALTH_PREFIX + method.name for method in HEALTH_SERVICE.methods),
        ]
        forwarder = Forwarder(internal, cfg.grpc_max_message_bytes)
        router = GrpcRouter(
            hot_methods(pubsub_servicers, cfg.limits.max_request_bytes),
            native_methods(table.handlers, paths),
            guard,
            forwarder,
            on_call=self._on_call,
            max_message_bytes=cfg.grpc_max_message_bytes,
            syncer=SyncDispatcher(
                self._sync(),
                cfg.grpc_max_message_bytes,
                clock=self._clock,
                background=self._background,
            ),
            warnings=self._warnings,
            relayed=lambda path: serves(table.handlers, path),
            admit=self._admit,
            clock=self._clock,
        )
        tls = self._security.tls
        front = FrontServer(
            router,
            forwarder,
            h2_limits(cfg),
            ssl_context=tls.ssl_server_context() if tls is not None else None,
            budget=ByteBudget(cfg.front_buffer_budget_bytes),
            clock=self._clock,
            warnings=self._warnings,
        )
        try:
            self.port = await front.start(cfg.host, cfg.port, reuse_port=self._admit is not None)
        except OSError:
            raise port_in_use(cfg.host, cfg.port) from None
        self.front = front

    def _sync(self) -> StartSync:
        assert self._start_sync is not None, "made by _register"
        return self._start_sync

    def _virtual_head(self) -> gcs_pb2.GcsNodeInfo | None:
        """``--head``: the record Ray's workers look up (see ``gcs.managers.head``)."""
        cfg = self._config
        if not cfg.head:
            return None
        meta = self._identity.meta
        return virtual_head(
            meta.cluster_id,
            address=self._advertised_host,
            temp_dir=cfg.temp_dir,
            session_name=meta.session_name,
            start_time_ms=now_ms(self._clock),
        )

    # -- a planned handover (gcs.server.ha_handover) ---------------------------------------
    def hold(self) -> None:
        """New calls are held, not answered (the front server only: grpc.aio alone has no
        such gate, its calls go on until the term stops)."""
        if self.front is not None:
            self.front.hold()

    async def quiesce(self, bound_s: float, poll_s: float = 0.001) -> int:
        """Held long polls answered, then until every admitted call was answered (or
        ``bound_s``) but those of :data:`CLUSTER_WAITS`: how many are still open."""
        await self._m.pubsub.stop()
        front = self.front
        if front is None:
            return 0

        async def drained() -> None:
            while front.in_flight and front.in_flight_except(CLUSTER_WAITS):
                await self._clock.sleep(poll_s)

        with contextlib.suppress(TimeoutError):
            await within(self._clock, bound_s, drained())
        if front.in_flight:
            log.info("rpc.handover_calls_still_open", paths=sorted(front.open_calls()))
        return front.in_flight

    def hand_off(self) -> int:
        """The next leader serves: GOAWAY, held calls refused (retried there); how many."""
        return self.front.hand_off() if self.front is not None else 0

    async def close(self) -> None:
        """Idempotent; safe before :meth:`run`."""
        grace_s = self.grace_s
        if self._closed:
            return
        self._closed = True
        self._stopped.set()
        if self.front is not None:
            self.front.goaway()  # no new streams: answered polls are not re-held
        await self._m.pubsub.stop()  # answer held long polls before the drain
        if self.front is not None:
            await self.front.stop(grace_s)  # open streams finish; relayed ones reach grpc.aio
        if self._server is not None:
            await self._server.stop(grace_s)
        await self._background.close()
        if self._private_dir:
            shutil.rmtree(self._private_dir, ignore_errors=True)
