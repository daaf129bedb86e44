"""The autoscaler as a running thing: provider + instance manager + reconciler + loop.

Used two ways, with the same code:
- embedded in ``gcs serve --autoscaler-config``: instances persist in the GCS's own store;
- standalone, ``gcs autoscaler run --gcs-address``: instances persist in the target GCS's
  InternalKV, so it works against Ray 2.60's GCS too.
Both talk to the GCS over its gRPC AutoscalerStateService.

At start, a local or command provider brings up the head node type if no head instance
runs yet (as ``ray up`` would), so a cluster YAML and one command are all a user needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.instances import (
    InstanceManager,
    InstanceStorage,
    StoreInstanceStorage,
)
from gcs.autoscaler.instances.storage import KvInstanceStorage
from gcs.autoscaler.providers.base import CloudProvider
from gcs.autoscaler.providers.command import CommandProvider, NodeCommands
from gcs.autoscaler.providers.kuberay.k8s import KubeApi
from gcs.autoscaler.providers.kuberay.provider import KubeRayProvider
from gcs.autoscaler.providers.local import LocalProvider
from gcs.autoscaler.providers.read_only import ReadOnlyProvider
from gcs.autoscaler.reconciler import (
    CloudInstanceUpdater,
    EventLog,
    GrpcAutoscalerGcs,
    RayStopper,
    ReconcileConfig,
    Reconciler,
)
from gcs.autoscaler.reconciler.observed import HEAD_RESOURCE
from gcs.autoscaler.scheduler.types import NodeKind
from gcs.clock import Clock, SystemClock
from gcs.proto import autoscaler_pb2
from gcs.rpc.security import Security
from gcs.server.metrics import on_loop
from gcs.store import Store

if TYPE_CHECKING:
    from gcs.server import GcsServer

log = structlog.get_logger("gcs.autoscaler")

EVENTS_NAMESPACE = b"gcs_autoscaler"
EVENTS_KEY = b"events"
DEFAULT_INTERVAL_S = 5.0
"""Ray's ``AUTOSCALER_UPDATE_INTERVAL_S``."""


def child_env(security: Security) -> dict[str, str]:
    """Environment that lets processes we start (raylets, workers) reach a secured GCS."""
    env: dict[str, str] = {}
    if security.token is not None:
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN"] = security.token.value
    return env


def build_provider(
    cluster: ClusterConfig,
    gcs_address: str,
    gcs: GrpcAutoscalerGcs,
    state_dir: Path,
    security: Security,
    *,
    kube_api: KubeApi | None = None,
    clock: Clock | None = None,
) -> CloudProvider:
    kind = cluster.provider.type
    if kind == "kuberay":
        if kube_api is None:
            raise ValueError("provider.type kuberay needs a Kubernetes API (--cluster-name)")
        return KubeRayProvider(
            kube_api, gcs, clock or SystemClock(), options=cluster.scheduler.options
        )
    if kind == "local":
        host = gcs_address.rsplit(":", 1)[0] or "127.0.0.1"
        return LocalProvider(
            cluster, gcs_address, state_dir, host=host, extra_env=child_env(security)
        )
    if kind == "command":
        commands: Mapping[str, NodeCommands] = {
            t: NodeCommands(c.start, c.stop) for t, c in cluster.provider.commands.items()
        }
        return CommandProvider(
            commands,
            gcs_address,
            state_dir,
            head_node_type=cluster.head_node_type,
            extra_env=child_env(security),
        )
    if kind == "read-only":
        return ReadOnlyProvider(gcs)
    raise ValueError(f"provider.type {kind!r} is not available in this build")


class AutoscalerRuntime:
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
        kube_api: KubeApi | None = None,
    ) -> None:
        """``kube_api``: the RayCluster to manage when ``cluster.provider.type`` is
        ``kuberay`` (``cluster`` is then its config as first read; every round re-reads it)."""
        self.cluster = cluster
        self.gcs_address = gcs_address
        self.clock = clock or SystemClock()
        self.interval_s = interval_s
        self.security = security if security is not None else Security.from_env()
        self._channel = self.security.aio_channel(gcs_address)
        self.gcs = GrpcAutoscalerGcs(self._channel)
        root = Path(cluster.provider.state_dir or state_dir)
        self.provider = build_provider(
            cluster, gcs_address, self.gcs, root, self.security, kube_api=kube_api, clock=self.clock
        )
        kuberay = self.provider if isinstance(self.provider, KubeRayProvider) else None
        storage: InstanceStorage = (
            StoreInstanceStorage(store) if store is not None else KvInstanceStorage(self.gcs)
        )
        self.events = EventLog(self.clock)
        self.updater = CloudInstanceUpdater(self.provider, self.clock, self.events)
        self.stopper = RayStopper(self.gcs, self.events)
        self.instances = InstanceManager(
            storage, self.clock, subscribers=[self.updater, self.stopper]
        )
        self.reconciler = Reconciler(
            instances=self.instances,
            provider=self.provider,
            gcs=self.gcs,
            cluster=cluster,
            clock=self.clock,
            events=self.events,
            updater=self.updater,
            stopper=self.stopper,
            config=config,
            config_source=kuberay.current_config if kuberay is not None else None,
            resizer=kuberay,
        )
        self._published_events = -1
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.instances.load()
        await self.ensure_head()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="autoscaler")
        log.info(
            "autoscaler.started",
            provider=self.cluster.provider.type,
            gcs=self.gcs_address,
            interval_s=self.interval_s,
            instances=len(self.instances.instances),
        )

    async def ensure_head(self) -> None:
        """Launch the head node type unless a head already runs: as a provider instance, or
        as a live Ray head the GCS lists (started by hand).  Local and command providers only;
        a command provider only when the head type has a start command."""
        kind = self.cluster.provider.type
        head = self.cluster.head_node_type
        if self.provider.read_only or kind not in ("local", "command"):
            return
        if kind == "command" and head not in self.cluster.provider.commands:
            return
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

    async def _loop(self) -> None:
        while True:
            await self.reconciler.reconcile_safely()
            await self._publish_events()
            await asyncio.sleep(self.interval_s)

    async def _publish_events(self) -> None:
        if self.events.version == self._published_events:
            return
        try:
            await self.gcs.put(EVENTS_NAMESPACE, EVENTS_KEY, self.events.to_json())
            self._published_events = self.events.version
        except Exception as err:  # the next round tries again
            log.warning("autoscaler.events_not_published", error=str(err))

    def metric_families(self) -> list[Any]:
        """``gcs_autoscaler_*`` figures, read at scrape time (gcs.server.metrics sources)."""
        from gcs.server.metrics import counters, gauge

        by_status = Counter(i.status.name for i in self.instances.instances.values())
        kinds = self.events.counts
        rec = self.reconciler
        return [
            gauge(
                "gcs_autoscaler_instances",
                "Autoscaler instances by status",
                {(name,): float(n) for name, n in by_status.items()},
                labels=("status",),
            ),
            counters("gcs_autoscaler_rounds", "Reconcile rounds run", float(rec.rounds)),
            counters(
                "gcs_autoscaler_failed_rounds",
                "Reconcile rounds aborted (provider, GCS or storage failure)",
                float(rec.failed_rounds),
            ),
            counters(
                "gcs_autoscaler_launched_nodes",
                "Nodes the provider accepted to launch",
                float(self.updater.launched),
            ),
            counters(
                "gcs_autoscaler_terminated_nodes",
                "Nodes the provider terminated",
                float(self.updater.terminated),
            ),
            counters(
                "gcs_autoscaler_events",
                "Autoscaler events by kind (launch, drain, drain-rejected, release, ...)",
                {(kind,): float(n) for kind, n in kinds.items()},
                labels=("kind",),
            ),
            counters(
                "gcs_autoscaler_invalid_updates",
                "Instance updates the lifecycle table rejected",
                float(self.instances.invalid_updates),
            ),
            counters(
                "gcs_autoscaler_failed_launches",
                "Instances whose launch failed, by cause (capacity, quota, error)",
                {(k,): float(n) for k, n in rec.capacity.failed_instances.items()},
                labels=("cause",),
            ),
            gauge(
                "gcs_autoscaler_held_back_node_types",
                "Node types held back after the cloud refused them (1 while held)",
                {(t,): 1.0 for t in rec.capacity.cache.held_back(self.clock.now_s())},
                labels=("node_type",),
            ),
        ]

    async def wait(self) -> None:
        if self._task is not None:
            await self._task

    async def stop(self) -> None:
        """Stop reconciling.  Launched instances keep running (a restart adopts them)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.updater.close()
        await self.stopper.close()
        await self._channel.close()

    async def stop_embedded(self) -> None:
        """``gcs serve`` exiting: a local cluster lives and dies with its server."""
        await self.stop()
        if self.cluster.provider.type == "local":
            await self.shutdown_cluster()

    async def shutdown_cluster(self) -> None:
        """Terminate every instance the provider runs (for demos and tests)."""
        running = await self.provider.get_non_terminated()
        if running:
            await self.provider.terminate(sorted(running), f"shutdown-{uuid.uuid4().hex}")


async def embedded_autoscaler(server: GcsServer, cluster: ClusterConfig) -> AutoscalerRuntime:
    """Start the autoscaler inside ``gcs serve``: instances in the GCS's own store."""
    interval = float(os.environ.get("AUTOSCALER_UPDATE_INTERVAL_S", DEFAULT_INTERVAL_S))
    runtime = AutoscalerRuntime(
        cluster,
        server.address,
        state_dir=Path(server.config.data_dir) / "autoscaler",
        store=server.store,
        interval_s=interval if interval > 0 else DEFAULT_INTERVAL_S,
        security=server.security,
    )
    await runtime.start()
    # read on the loop that owns the state (the scrape runs on the HTTP server's thread)
    server.metrics.add_source(on_loop(asyncio.get_running_loop(), runtime.metric_families))
    return runtime
