"""``GcsServer``: the GCS as one object -- wire it, load it, run it, stop it.

A facade over the wiring (:mod:`gcs.server.wiring`, which builds every component with no
I/O) and the :class:`~gcs.lifecycle.Supervisor` (load in order -> run all -> close in
reverse; the first failure stops everything).  :meth:`GcsServer.start` returns once the GCS
port serves; :meth:`GcsServer.wait` until :meth:`GcsServer.stop` or a failure, which it
raises.  Startup is design.md's load -> repair -> serve: every ``load()`` (the store, then
each manager's state and its repairs) finishes before any ``run()`` serves or loops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
from collections.abc import Callable

import structlog

from gcs.clock import Clock, SystemClock
from gcs.config import GcsConfig
from gcs.lifecycle import ComponentFailed, Supervisor
from gcs.managers.cluster_meta import ClusterMeta
from gcs.managers.lane import ResolvePolicy
from gcs.rpc.front import FrontServer
from gcs.rpc.raylets.actors import ActorGateway
from gcs.rpc.raylets.gateway import RayletGateway
from gcs.rpc.security import Security
from gcs.sdk import HA_LEADER_KEY, HA_NAMESPACE
from gcs.server.addresses import advertised_host
from gcs.server.extras import Extras
from gcs.server.gc_policy import SurvivorFreezer, freeze_start_heap
from gcs.server.ha import HaCoordinator, HaSettings
from gcs.server.ha_lock import LockDir, default_lock_dir
from gcs.server.ha_mirror import TakeoverStore
from gcs.server.ha_status import HaStatusServer
from gcs.server.head_processes import SupervisedChild
from gcs.server.managers import Managers
from gcs.server.metrics import GcsMetrics
from gcs.server.wiring import Wiring, build
from gcs.store import Store, store_from_url
from gcs.store.factory import open_with_retry

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
        self.metrics = GcsMetrics()
        self.advertised_host = advertised_host(config.host)
        self.wiring: Wiring | None = None
        self._supervisor: Supervisor | None = None
        self._running: asyncio.Task[None] | None = None
        self._stopping = False
        self.ha: HaCoordinator | None = None
        self._standby_heap_frozen = False
        """With ``ha.enabled`` (``gcs serve --ha``): this member's lease loop and role."""
        self.ha_status: HaStatusServer | None = None
        """With ``ha.status_port``: the member's own health port."""

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
            self._store = store_from_url(
                self.config.storage_url(),
                namespace=self.config.namespace,
                redis=self.config.redis.options(),
                ha=self.config.ha.enabled,
            )
        if self.config.ha.enabled:
            await self._start_ha()
            return
        self.wiring = self._build(self.config, self._store, owns_store=self._owns_store)
        self._supervisor = Supervisor(self.wiring.components)
        try:
            await self._supervisor.load()
        except ComponentFailed as failed:
            raise _cause(failed) from None
        self._running = asyncio.create_task(self._supervisor.run(), name="gcs")
        serving = asyncio.create_task(self.wiring.rpc.serving())
        await asyncio.wait({self._running, serving}, return_when=asyncio.FIRST_COMPLETED)
        serving.cancel()
        if not self.wiring.rpc.is_serving:
            await self.stop()
            await self.wait()  # raises what failed
            raise RuntimeError("the GCS stopped before it served")
        meta = self.wiring.identity.meta
        log.info(
            "gcs.started",
            address=self.address,
            storage=self._store.url,
            cluster_id=meta.cluster_id_hex,
            metrics_port=self.metrics_port,
            alive_nodes=len(self.wiring.managers.nodes.alive),
            new_cluster=meta.created,
        )

    async def _start_ha(self) -> None:
        """``--ha``: returns once this member is a warm standby (it may already lead);
        :meth:`wait` runs its terms (``gcs.server.ha``)."""
        cfg, store = self.config, self.store
        await open_with_retry(store, self.clock)
        if cfg.metrics_port >= 0:  # across terms; each term's wiring serves none
            self.metrics.serve(cfg.host, cfg.metrics_port)
        if cfg.ha.status_port >= 0:
            self.ha_status = HaStatusServer()
            await self.ha_status.start(cfg.host, cfg.ha.status_port)
        ha = self.ha = HaCoordinator(
            store,
            self.clock,
            HaSettings.of(cfg.ha),
            start_term=self._start_term,
            metrics=self.metrics,
            on_serving=self.ha_status.set if self.ha_status is not None else None,
            locks=self._holder_locks(),
            on_mirror_loaded=self._freeze_standby_heap,
        )
        self._running = asyncio.create_task(ha.run(), name="gcs-ha")
        warm = asyncio.create_task(ha.warm())
        await asyncio.wait({self._running, warm}, return_when=asyncio.FIRST_COMPLETED)
        if not warm.done():
            warm.cancel()
            await self._running  # raises what failed
        log.info(
            "gcs.ha_member", storage=store.url, metrics_port=self.metrics_port, **ha.describe()
        )

    def _freeze_standby_heap(self) -> None:
        """The standby's start-up heap (modules, the warm copy) frozen once, as the ``gc``
        component does at a plain start (``gcs.server.gc_policy``), so that the takeover's
        term does not pay for that full collection."""
        if self.config.gc_gen0_threshold > 0 and not self._standby_heap_frozen:
            self._standby_heap_frozen = True
            freeze_start_heap()

    def _holder_locks(self) -> LockDir | None:
        """Same-host death detection (``ha.lock_dir``; ``off``: none)."""
        cfg = self.config
        if cfg.ha.lock_dir == "off":
            return None
        directory = (
            pathlib.Path(cfg.ha.lock_dir)
            if cfg.ha.lock_dir
            else default_lock_dir(cfg.storage_url(), cfg.namespace)
        )
        return LockDir(directory, self.clock)

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
        )

    async def _start_term(self, store: TakeoverStore, admit: Callable[[], bool]) -> _LeaderTerm:
        """One HA leader term: wire afresh on the term's store, load (from the standby's
        mirror), run; returns once the shared port serves."""
        wiring = self._build(
            dataclasses.replace(self.config, metrics_port=-1), store, owns_store=False, admit=admit
        )
        supervisor = Supervisor(wiring.components)
        try:
            await supervisor.load()
        except ComponentFailed as failed:
            raise _cause(failed) from None
        store.release_mirror()
        running = asyncio.create_task(supervisor.run(), name="gcs-term")
        term = _LeaderTerm(wiring, supervisor, running, on_stopped=self._term_stopped)
        serving = asyncio.create_task(wiring.rpc.serving())
        await asyncio.wait({running, serving}, return_when=asyncio.FIRST_COMPLETED)
        serving.cancel()
        if not wiring.rpc.is_serving:
            failure = running.exception() if running.done() else None
            await term.stop()
            if isinstance(failure, ComponentFailed):
                raise _cause(failure)
            raise RuntimeError("the GCS term stopped before it served")
        self.wiring = wiring
        assert self.ha is not None
        record = {"holder": self.ha.settings.holder, "epoch": self.ha.epoch}
        record["since"] = round(self.clock.now_s(), 3)
        try:  # `gcs status` shows who leads (a fenced write here ends the term)
            await wiring.managers.kv.put(
                HA_NAMESPACE, HA_LEADER_KEY, json.dumps(record).encode(), overwrite=True
            )
        except BaseException:
            await term.stop()
            raise
        return term

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
        if self.ha is not None:
            try:
                await asyncio.shield(self._running)
            except asyncio.CancelledError:
                if not self._stopping:
                    raise
            return
        try:
            await asyncio.shield(self._running)
        except ComponentFailed as failed:
            await self.stop()
            raise _cause(failed) from None

    async def stop(self, grace_s: float = 2.0) -> None:
        """Close every component in reverse order; idempotent, safe before start."""
        if self.ha is not None:
            await self._stop_ha()
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

    async def _stop_ha(self) -> None:
        """The term closes, the lease is released, the store closed (if ours)."""
        if self._stopping:
            return
        self._stopping = True
        running = self._running
        if running is not None:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        self.metrics.close()
        if self.ha_status is not None:
            await self.ha_status.close()
        if self._owns_store and self._store is not None:
            await self._store.close()
        log.info("gcs.stopped")

    async def __aenter__(self) -> GcsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class _LeaderTerm:
    """One running HA term (:class:`gcs.server.ha.Term`)."""

    def __init__(
        self,
        wiring: Wiring,
        supervisor: Supervisor,
        running: asyncio.Task[None],
        *,
        on_stopped: Callable[[Wiring], None],
    ) -> None:
        self.wiring = wiring
        self._supervisor = supervisor
        self._running = running
        self._on_stopped = on_stopped

    async def wait(self) -> None:
        try:
            await asyncio.shield(self._running)
        except ComponentFailed as failed:
            raise _cause(failed) from None

    async def stop(self) -> None:
        self.wiring.rpc.grace_s = 0.0  # not the leader any more: nothing waits to finish
        self._supervisor.stop()
        await asyncio.gather(self._running, return_exceptions=True)
        await self._supervisor.close()
        self._on_stopped(self.wiring)


def _cause(failed: ComponentFailed) -> BaseException:
    """What the component raised (callers and the CLI report that, not the wrapper)."""
    return failed.cause
