"""What ``gcs serve`` runs beside the GCS: the embedded autoscaler and the demo cluster.

Each is a component of the wiring's list (:mod:`gcs.server.wiring`), started once the GCS
port serves and closed before it (they are its clients), built from narrow ports -- the
GCS address, the store, the security to dial with, a data directory, the metrics registry
-- never from the server itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gcs.base.clock import Clock
from gcs.base.lifecycle import Component, Part
from gcs.policy.virtual_clusters.launchable import NO_AUTOSCALER, Launchable
from gcs.rpc.security import Security
from gcs.server.metrics import GcsMetrics, MetricSource, on_loop
from gcs.store import Store

if TYPE_CHECKING:
    from gcs.autoscaler.config import ClusterConfig

__all__ = ["Extras", "autoscaler_component", "demo_component", "launchable_of"]

Serving = Callable[[], Awaitable[object]]
"""Returns once the GCS port accepts calls."""


@dataclass(frozen=True, slots=True)
class Extras:
    """What ``gcs serve`` adds beside the GCS itself (components after the server's)."""

    autoscaler: ClusterConfig | None = None
    """A cluster config: run the embedded autoscaler."""
    demo_nodes: int = 0
    """Start this many local raylet agents with synthetic load."""
    autoscaler_limits: Launchable | None = None
    """The limits of an autoscaler that runs outside this process (a standalone one, or a
    test's reconciler), weighed like the embedded one's; None = from ``autoscaler``."""


def launchable_of(extras: Extras) -> Launchable:
    """The autoscaler's limits as the virtual-cluster manager weighs them: worker node types
    (not the head's) with their ``max_workers``, and ``max_num_nodes``."""
    if extras.autoscaler_limits is not None:
        return extras.autoscaler_limits
    cluster = extras.autoscaler
    if cluster is None:
        return NO_AUTOSCALER
    scheduler = cluster.scheduler
    return Launchable(
        max_workers={
            name: spec.max_workers
            for name, spec in sorted(scheduler.node_types.items())
            if name != cluster.head_node_type
        },
        max_nodes=scheduler.max_num_nodes,
    )


def autoscaler_component(
    cluster: ClusterConfig,
    *,
    gcs_address: Callable[[], str],
    store: Store,
    security: Security,
    data_dir: str,
    metrics: GcsMetrics,
    clock: Clock,
    serving: Serving,
) -> Component:
    """The embedded autoscaler (``gcs serve --autoscaler-config``), given narrow ports: the
    GCS address (once serving), the store for its instances, the security to dial with, a
    state directory, the metrics registry and the clock.  The one place the server reaches
    into ``gcs.autoscaler``: the runtime is itself a component, built once the port serves
    (it dials the GCS)."""
    from gcs.autoscaler.runtime import AutoscalerRuntime, embedded_autoscaler

    state: dict[str, AutoscalerRuntime] = {}
    sources: list[MetricSource] = []

    def register(source: MetricSource) -> None:
        # read on the loop that owns the state (the scrape runs on the HTTP thread)
        sources.append(on_loop(asyncio.get_running_loop(), source))
        metrics.add_source(sources[-1])

    async def run() -> None:
        await serving()
        runtime = embedded_autoscaler(
            cluster,
            gcs_address=gcs_address(),
            store=store,
            security=security,
            data_dir=data_dir,
            register_metrics=register,
            clock=clock,
        )
        state["runtime"] = runtime
        await runtime.load()
        await runtime.run()

    async def close() -> None:
        runtime = state.pop("runtime", None)
        if runtime is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await runtime.close()
        while sources:  # an HA term ended: the next one registers its own
            metrics.remove_source(sources.pop())

    return Part("autoscaler", run=run, close=close)


def demo_component(
    nodes: int,
    *,
    gcs_address: Callable[[], str],
    security: Security,
    agents: bool,
    serving: Serving,
) -> Component:
    """``gcs serve --demo N``: local raylet agents (unless an autoscaler provides the nodes)
    and the demo's synthetic load (:mod:`gcs.raylet.demo`), once the GCS serves."""
    from gcs.raylet.demo import DemoCluster

    state: dict[str, DemoCluster] = {}

    async def run() -> None:
        await serving()
        demo = DemoCluster(gcs_address(), nodes=nodes, security=security)
        state["demo"] = demo
        await demo.start(agents=agents)
        await asyncio.Event().wait()  # runs until the supervisor stops it

    async def close() -> None:
        demo = state.pop("demo", None)
        if demo is not None:
            await demo.stop()

    return Part("demo", run=run, close=close)
