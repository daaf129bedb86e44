"""``GcsServer``: the GCS as one object -- wire it, load it, run it, stop it.

A facade over the wiring (:mod:`gcs.server.wiring`, which builds every component with no
I/O) and the :class:`~gcs.base.lifecycle.Supervisor` (load in order -> run all -> close in
reverse; the first failure stops everything).  :meth:`GcsServer.start` returns once the GCS
port serves; :meth:`GcsServer.wait` until :meth:`GcsServer.stop` or a failure, which it
raises.  Every ``load()`` (the store, then each manager's state and its repairs) finishes
before any ``run()`` serves or loops.  With ``--ha``: :mod:`gcs.server.ha_member`."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import structlog

from gcs.base.clock import Clock, SystemClock
from gcs.base.lifecycle import ComponentFailed, Supervisor, start_until_ready
from gcs.config import GcsConfig
from gcs.front import FrontServer
from gcs.managers.cluster_meta import ClusterMeta
from gcs.managers.lane import ResolvePolicy
from gcs.rpc.raylet_io.actors import ActorGateway
from gcs.rpc.raylet_io.gateway import RayletGateway
from gcs.rpc.security import Security
from gcs.server.addresses import advertised_host
from gcs.server.extras import Extras
from gcs.server.gc_policy import SurvivorFreezer
from gcs.server.ha import HaCoordinator
from gcs.server.ha_handover import stop_member
from gcs.server.ha_member import LeaderTerm, member, run_until_warm, start_leader_term
from gcs.server.ha_mirror import TakeoverStore
from gcs.server.ha_status import HaStatusServer
from gcs.server.head_processes import SupervisedChild
from gcs.server.managers import Managers
from gcs.server.metrics import GcsMetrics
from gcs.server.rpc_server import PreparedAhead
from gcs.server.store_open import build_configured, open_configured
from gcs.server.wiring import Wiring, build
from gcs.store import Store
from gcs.store.factory import redact_url

__all__ = ["GcsServer", "Managers"]

log = structlog.get_logger("gcs.server")


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
        extras: Extras | None = None,
    ) -> None:
        """``store``: opened and closed by the caller (else built from the config's URL
        and owned).  ``lane_policy``: how each manager's lane asks the store about ambiguous
        writes.  ``raylets`` / ``actor_gateway``: fakes in tests.  ``extras``: what ``gcs
        serve`` runs beside the GCS (embedded autoscaler, demo cluster)."""
        self.config = config
        self.clock = clock or SystemClock()
        self._security = security
        self._store = store
        self._owns_store = store is None
        self._lane_policy = lane_policy
        self._raylets = raylets
        self._actor_gateway = actor_gateway
        self._extras = extras or Extras()
        self.prepared = PreparedAhead()  # --ha: the terms' RPC server parts
        self.metrics = GcsMetrics()
        self.advertised_host = config.node_ip_address or advertised_host(config.host)
        self.wiring: Wiring | None = None
        self._supervisor: Supervisor | None = None
        self._running: asyncio.Task[None] | None = None
        self._stopping = False
        self.ha: HaCoordinator | None = None
        """With ``ha.enabled``: the member's lease loop; ``ha_status``: its health port."""
        self.ha_status: HaStatusServer | None = None

    # -- what tests, the CLI and benches read ----------------------------------------------
    @property
    def managers(self) -> Managers | None:
        return self.wiring.managers if self.wiring is not None else None

    @property
    def meta(self) -> ClusterMeta | None:
        identity = self.wiring.identity if self.wiring is not None else None
        return identity.meta if identity is not None and identity.loaded else None

    @property
    def port(self) -> int:
        return self.wiring.rpc.port if self.wiring is not None else 0

    @property
    def front(self) -> FrontServer | None:
        """The front server on the GCS port (None before it serves, or with grpc.aio alone)."""
        return self.wiring.rpc.front if self.wiring is not None else None

    @property
    def metrics_port(self) -> int:
        return self.metrics.port

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
        """The backend itself (managers get it wrapped in a ``MeteredStore``)."""
        assert self._store is not None, "server not started"
        return self._store

    @property
    def security(self) -> Security:
        """Auth/TLS in force (resolved at start from config + Ray's environment)."""
        assert self._security is not None, "server not started"
        return self._security

    @property
    def children(self) -> list[SupervisedChild]:
        """Ray processes run beside a ``--head`` GCS (``gcs.server.head_processes``)."""
        return self.wiring.children.children if self.wiring is not None else []

    @property
    def gc_freezer(self) -> SurvivorFreezer | None:
        return self.wiring.gc.freezer if self.wiring is not None else None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Wire, load every component, run them; returns once the GCS port serves.  A
        failure closes what was loaded and is raised as the component raised it."""
        self._resolve_security()
        if self._store is None:
            self._store = build_configured(self.config, self.clock)
        if self.config.ha.enabled:
            await self._start_ha()
            return
        self.wiring = self._build(self.config, self._store, owns_store=self._owns_store)
        self._supervisor = Supervisor(self.wiring.components)
        try:
            await self._supervisor.load()
        except ComponentFailed as failed:
            raise failed.cause from None
        self._running = await start_until_ready(
            self._supervisor.run(), self.wiring.rpc.serving(), name="gcs"
        )
        if not self.wiring.rpc.is_serving:
            await self.stop()
            await self.wait()  # raises what failed
            raise RuntimeError("the GCS stopped before it served")
        meta = self.wiring.identity.meta
        log.info(
            "gcs.started",
            address=self.address,
            storage=redact_url(self._store.url),
            cluster_id=meta.cluster_id_hex,
            metrics_port=self.metrics_port or "off",
            alive_nodes=len(self.wiring.managers.nodes.alive),
            new_cluster=meta.created,
        )

    async def _start_ha(self) -> None:
        """``--ha``: returns once a warm standby (it may lead); :meth:`wait` runs its terms."""
        cfg, store = self.config, self.store
        await open_configured(store, self.clock, cfg)
        if cfg.metrics_port >= 0:  # across terms; each term's wiring serves none
            self.metrics.serve(cfg.host, cfg.metrics_port)
        self.ha, self.ha_status = await member(
            cfg, store, self.clock, self.metrics, self._start_term, prepare=self.prepared.build
        )
        self._running = await run_until_warm(self.ha)
        port = self.metrics_port or "off"
        log.info(
            "gcs.ha_member", storage=redact_url(store.url), metrics_port=port, **self.ha.describe()
        )

    def _build(
        self,
        config: GcsConfig,
        store: Store,
        *,
        owns_store: bool,
        admit: Callable[[], bool] | None = None,
    ) -> Wiring:
        """The wiring of one serving GCS (the whole run, or one HA leader term)."""
        return build(
            config,
            store=store,
            owns_store=owns_store,
            clock=self.clock,
            security=self.security,
            metrics=self.metrics,
            advertised_host=self.advertised_host,
            lane_policy=self._lane_policy,
            raylets=self._raylets,
            actor_gateway=self._actor_gateway,
            extras=self._extras,
            admit=admit,
            start_heap_frozen=admit is not None,  # an HA term: frozen when the mirror loaded
            prepared=self.prepared.parts,
        )

    async def _start_term(self, store: TakeoverStore, admit: Callable[[], bool]) -> LeaderTerm:
        """One HA leader term: wire afresh on the term's store, load (from the standby's
        mirror), run; returns once the shared port serves."""
        wiring = self._build(
            dataclasses.replace(self.config, metrics_port=-1), store, owns_store=False, admit=admit
        )
        assert self.ha is not None
        leader = {"holder": self.ha.settings.holder, "epoch": self.ha.epoch}
        leader["since"] = round(self.clock.now_s(), 3)
        return await start_leader_term(
            wiring, store, leader, on_serving=self._term_serving, on_stopped=self._term_stopped
        )

    def _term_serving(self, wiring: Wiring) -> None:
        self.wiring = wiring

    def _term_stopped(self, wiring: Wiring) -> None:
        if self.wiring is wiring:
            self.wiring = None

    def _resolve_security(self) -> Security:
        """Before anything else, so a misconfiguration fails the start with one clear line."""
        if self._security is None:
            cfg = self.config
            self._security = Security.for_server(cfg.auth_mode, cfg.auth_token_path)
        log.info("gcs.security", **self._security.describe())
        return self._security

    async def wait(self) -> None:
        """Until :meth:`stop`, or a component failed (then its error is raised, after every
        component was closed)."""
        if self._running is None:
            return
        try:
            await asyncio.shield(self._running)
        except asyncio.CancelledError:
            if self.ha is None or not self._stopping:  # an HA member's run ends cancelled
                raise
        except ComponentFailed as failed:
            if self.ha is not None:
                raise
            await self.stop()
            raise failed.cause from None

    async def stop(self, grace_s: float = 2.0, *, hand_over: bool = False) -> None:
        """Close every component in reverse order; idempotent, safe before start.
        ``hand_over`` (``gcs serve`` on SIGTERM): an HA leader hands over to a standby first
        (``gcs.server.ha_handover``)."""
        if self.ha is not None:
            await self._stop_ha(hand_over=hand_over)
            return
        if self._stopping or self._supervisor is None:
            self._stopping = True
            return
        self._stopping = True
        if self.wiring is not None:
            self.wiring.rpc.grace_s = grace_s
        self._supervisor.stop()
        if self._running is not None:
            await asyncio.gather(self._running, return_exceptions=True)
        await self._supervisor.close()
        log.info("gcs.stopped")

    async def _stop_ha(self, *, hand_over: bool) -> None:
        """A leader hands over to a standby first (``gcs.server.ha_handover``); the term
        closes, the lease is released, the store closed (if ours)."""
        if self._stopping:
            return
        self._stopping = True
        assert self.ha is not None
        await stop_member(self.ha, self._running, self.ha_status, hand_over=hand_over)
        self.metrics.close()
        if self._owns_store and self._store is not None:
            await self._store.close()
        log.info("gcs.stopped")

    async def __aenter__(self) -> GcsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
