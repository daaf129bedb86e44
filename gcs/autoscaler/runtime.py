"""The autoscaler as a component: provider + instance manager + reconciler in a loop.

Used two ways, with the same code:
- embedded in ``gcs serve --autoscaler-config`` (:func:`embedded_autoscaler`): instances
  persist in the GCS's own store; a component of the server (``load`` -> ``run`` ->
  ``close``, :mod:`gcs.base.lifecycle`) built from narrow arguments, never the server itself;
- standalone, ``gcs autoscaler run --gcs-address``: instances persist in the target GCS's
  InternalKV, so it works against Ray 2.60's GCS too.
Both talk to the GCS over its gRPC AutoscalerStateService.

The provider comes from the registry (``provider.type`` -> factory); what it can do beyond
the contract is what its ``capabilities`` declare.  At start, a provider that declares
``starts_head`` brings up the head node type if no head runs yet (as ``ray up`` would), so a
cluster YAML and one command are all a user needs.  Every wait is on the injected clock.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import grpc
import structlog
from prometheus_client.core import Metric

from gcs.autoscaler import metrics
from gcs.autoscaler.config import ClusterConfig, ConfigError
from gcs.autoscaler.gcs_api import RuntimeGcs
from gcs.autoscaler.grpc_gcs import GrpcAutoscalerGcs
from gcs.autoscaler.instances import InstanceManager, InstanceStorage, StoreInstanceStorage
from gcs.autoscaler.instances.storage import KvInstanceStorage
from gcs.autoscaler.providers.base import CloudProvider, ProviderContext, provider_factory
from gcs.autoscaler.providers.registry import PROVIDERS, Registry
from gcs.autoscaler.reconciler import (
    CloudInstanceUpdater,
    EventLog,
    RayStopper,
    ReconcileConfig,
    Reconciler,
)
from gcs.base.background import Background
from gcs.base.clock import Clock, SystemClock
from gcs.policy.autoscaling.model import HEAD_RESOURCE, NodeKind
from gcs.policy.autoscaling.scheduler import waiting
from gcs.proto import autoscaler_pb2
from gcs.rpc.security import Security
from gcs.store import Store

__all__ = [
    "DEFAULT_INTERVAL_S",
    "AutoscalerRuntime",
    "child_env",
    "embedded_autoscaler",
    "interval_from_env",
]

log = structlog.get_logger("gcs.autoscaler")

EVENTS_NAMESPACE = b"gcs_autoscaler"
EVENTS_KEY = b"events"
WAITING_KEY = b"waiting"
"""Why demand waits (:mod:`gcs.policy.autoscaling.scheduler.waiting`), as of the last round."""
DEFAULT_INTERVAL_S = 5.0
"""Ray's ``AUTOSCALER_UPDATE_INTERVAL_S``."""


def child_env(security: Security) -> dict[str, str]:
    """Environment that lets processes we start (raylets, workers) reach a secured GCS."""
    env: dict[str, str] = {}
    if security.token is not None:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN"] = security.token.value
    return env


def interval_from_env(environ: Mapping[str, str]) -> float:
    """``AUTOSCALER_UPDATE_INTERVAL_S`` as ``gcs serve`` reads it (unset, not a number or
    not > 0: 5 s, as Ray)."""
    raw = environ.get("AUTOSCALER_UPDATE_INTERVAL_S")
    try:
        interval = DEFAULT_INTERVAL_S if raw is None else float(raw)
    except ValueError:
        log.warning("autoscaler.bad_interval", AUTOSCALER_UPDATE_INTERVAL_S=raw)
        return DEFAULT_INTERVAL_S
    return interval if interval > 0 else DEFAULT_INTERVAL_S


class AutoscalerRuntime:
    """A :class:`gcs.base.lifecycle.Component` named ``autoscaler``."""

    name = "autoscaler"

    def __init__(
        self,
        cluster: ClusterConfig,
        gcs_address: str,
        *,
        state_dir: str | Path,
        store: Store | None = None,
        clock: Clock | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        config: ReconcileConfig | None = None,
        security: Security | None = None,
        gcs: RuntimeGcs | None = None,
        providers: Registry = PROVIDERS,
        register_metrics: metrics.RegisterMetrics | None = None,
        embedded: bool = False,
    ) -> None:
        """``store``: keep instances there (embedded), else in the GCS's InternalKV.
        ``gcs``: the GCS to talk to in process (default: a gRPC client of ``gcs_address``,
        which is also the address the instances' raylets register with).  ``providers``:
        the registry ``cluster.provider.type`` is looked up in (a provider whose config
        lives in the cloud re-reads it every round: ``cluster`` is its first read).
        ``embedded``: inside
        ``gcs serve``; closing terminates the instances of a provider that
        ``ends_with_server``."""
        self.cluster = cluster
        self.gcs_address = gcs_address
        self.clock = clock or SystemClock()
        self.interval_s = interval_s
        self.security = security if security is not None else Security.from_env()
        self._channel: grpc.aio.Channel | None = None
        if gcs is None:
            self._channel = self.security.aio_channel(gcs_address)
            gcs = GrpcAutoscalerGcs(self._channel)
        self.gcs: RuntimeGcs = gcs
        self.provider = self._build_provider(
            providers,
            ProviderContext(
                cluster=cluster,
                gcs_address=gcs_address,
                gcs=gcs,
                clock=self.clock,
                state_dir=Path(cluster.provider.state_dir or state_dir),
                child_env=child_env(self.security),
            ),
        )
        self.capabilities = self.provider.capabilities
        storage: InstanceStorage = (
            StoreInstanceStorage(store) if store is not None else KvInstanceStorage(gcs)
        )
        self.events = EventLog(self.clock)
        self.updater = CloudInstanceUpdater(self.provider, self.clock, self.events)
        self.stopper = RayStopper(gcs, self.events)
        self.instances = InstanceManager(
            storage, self.clock, subscribers=[self.updater, self.stopper]
        )
        self.reconciler = Reconciler(
            instances=self.instances,
            provider=self.provider,
            gcs=gcs,
            cluster=cluster,
            clock=self.clock,
            events=self.events,
            updater=self.updater,
            stopper=self.stopper,
            config=config,
        )
        self._register_metrics = register_metrics
        self._embedded = embedded
        self._published_events = -1
        self._round_done = asyncio.Event()
        self.completed_rounds = 0
        self._background = Background("autoscaler")
        """Only :meth:`start` uses it (standalone, tests): ``gcs serve``'s supervisor runs
        :meth:`run` itself."""
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @staticmethod
    def _build_provider(providers: Registry, context: ProviderContext) -> CloudProvider:
        kind = context.cluster.provider.type
        if kind not in providers:
            raise ConfigError(
                f"provider.type: {kind!r} is not supported here (one of {', '.join(providers)})"
            )
        return provider_factory(kind, providers)(context)

    # -- Component -------------------------------------------------------------------------
    async def load(self) -> None:
        """Read the instances from storage and offer the metrics; nothing is launched."""
        await self.instances.load()
        if self._register_metrics is not None:
            self._register_metrics(self.metric_families)

    async def run(self) -> None:
        """Bring up the head if the provider does that, then reconcile every interval."""
        await self.ensure_head()
        log.info(
            "autoscaler.started",
            provider=self.cluster.provider.type,
            gcs=self.gcs_address,
            interval_s=self.interval_s,
            instances=len(self.instances.instances),
        )
        while True:
            await self.reconciler.reconcile_safely()
            await self._publish_events()
            await self._publish_waiting()
            self.completed_rounds += 1
            done, self._round_done = self._round_done, asyncio.Event()
            done.set()
            await self.clock.sleep(self.interval_s)

    async def close(self) -> None:
        """Stop reconciling (idempotent).  Launched instances keep running -- a restart
        adopts them -- unless embedded with a provider that ``ends_with_server``."""
        if self._closed:
            return
        self._closed = True
        await self._background.close()
        await self.updater.close()
        await self.stopper.close()
        if self._embedded and self.capabilities.ends_with_server:
            try:
                await self.shutdown_cluster()
            except Exception as err:  # what is left is adopted by the next start
                log.warning("autoscaler.shutdown_failed", error=repr(err))
        if self._channel is not None:
            await self._channel.close()

    # -- running it by hand (standalone command, tests) -------------------------------------
    async def start(self) -> None:
        """``load()``, then ``run()`` in a task of its own (:meth:`wait`, :meth:`close`)."""
        await self.load()
        self._task = self._background.spawn(self.run(), "rounds")

    async def wait(self) -> None:
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        await self.close()

    def round_completed(self) -> asyncio.Event:
        """Set when the round now running (or the next one to run) has completed."""
        return self._round_done

    # -- parts of a run --------------------------------------------------------------------
    async def ensure_head(self) -> None:
        """Launch the head node type unless a head already runs: as a provider instance, or
        as a live Ray head the GCS lists (started by hand).  Only for a provider that
        declares ``starts_head``."""
        if not self.capabilities.starts_head or self.capabilities.read_only:
            return
        head = self.cluster.head_node_type
        running = await self.provider.get_non_terminated()
        if any(ci.node_kind is NodeKind.HEAD for ci in running.values()):
            return
        try:
            state = await self.gcs.get_cluster_resource_state()
        except Exception as err:  # no GCS answer yet: the provider's view decides
            log.warning("autoscaler.head_check_failed", error=str(err))
        else:
            live = (autoscaler_pb2.RUNNING, autoscaler_pb2.IDLE)
            if any(
                HEAD_RESOURCE in ns.total_resources and ns.status in live
                for ns in state.node_states
            ):
                return
        await self.provider.launch({head: 1}, f"head-{uuid.uuid4().hex}")
        self.events.add("launch", f"Adding 1 x {head} (head node)")

    async def _publish_events(self) -> None:
        if self.events.version == self._published_events:
            return
        try:
            await self.gcs.put(EVENTS_NAMESPACE, EVENTS_KEY, self.events.to_json())
            self._published_events = self.events.version
        except Exception as err:  # the next round tries again
            log.warning("autoscaler.events_not_published", error=str(err))

    async def _publish_waiting(self) -> None:
        """The last round's verdicts, for ``gcs status`` and ``gcs submit`` (rewritten every
        round: its time says how fresh it is)."""
        doc = waiting.to_json(self.reconciler.waiting, at_s=self.clock.now_s())
        try:
            await self.gcs.put(EVENTS_NAMESPACE, WAITING_KEY, doc)
        except Exception as err:  # the next round tries again
            log.warning("autoscaler.waiting_not_published", error=str(err))

    def figures(self) -> metrics.AutoscalerFigures:
        return metrics.AutoscalerFigures(
            instances_by_status=Counter(i.status.name for i in self.instances.instances.values()),
            rounds=self.reconciler.rounds,
            failed_rounds=self.reconciler.failed_rounds,
            launched_nodes=self.updater.launched,
            terminated_nodes=self.updater.terminated,
            events_by_kind=dict(self.events.counts),
            invalid_updates=self.instances.invalid_updates,
            failed_launches_by_cause=dict(self.reconciler.capacity.failed_instances),
            held_back_node_types=tuple(
                self.reconciler.capacity.cache.held_back(self.clock.now_s())
            ),
            waiting_requests=dict(waiting.counts(self.reconciler.waiting)),
        )

    def metric_families(self) -> list[Metric]:
        """``gcs_autoscaler_*`` figures; reads loop-owned state (call it on the loop)."""
        return metrics.families(self.figures())

    async def shutdown_cluster(self) -> None:
        """Terminate every instance the provider runs (for demos and tests)."""
        running = await self.provider.get_non_terminated()
        if running:
            await self.provider.terminate(sorted(running), f"shutdown-{uuid.uuid4().hex}")


def embedded_autoscaler(
    cluster: ClusterConfig,
    *,
    gcs_address: str,
    store: Store,
    security: Security,
    data_dir: str | Path,
    register_metrics: metrics.RegisterMetrics | None = None,
    clock: Clock | None = None,
    environ: Mapping[str, str] = os.environ,
    gcs: RuntimeGcs | None = None,
    providers: Registry = PROVIDERS,
) -> AutoscalerRuntime:
    """The autoscaler component of ``gcs serve``: instances in the GCS's own store,
    provider state under ``<data_dir>/autoscaler``, a round every
    ``AUTOSCALER_UPDATE_INTERVAL_S``.  ``gcs``: the GCS in process (default: a gRPC client
    of ``gcs_address``)."""
    return AutoscalerRuntime(
        cluster,
        gcs_address,
        state_dir=Path(data_dir) / "autoscaler",
        store=store,
        clock=clock,
        interval_s=interval_from_env(environ),
        security=security,
        gcs=gcs,
        providers=providers,
        register_metrics=register_metrics,
        embedded=True,
    )
