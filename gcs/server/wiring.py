"""Every collaborator of one GCS, built and connected here, with no I/O.

:func:`build` reads as a table of contents: the managers with the raylet I/O layer and
pubsub (:mod:`gcs.server.wiring_managers`), every event listener subscribed in one visible
list per kind of event (the order the events reach them), then the RPC server and the
component list the supervisor runs (:mod:`gcs.server.wiring_components`): ``load()`` in
list order, ``run()`` all at once, ``close()`` in reverse order.  Nothing here reads the
store, binds a port or starts a task; that is what ``load()`` and ``run()`` are for.

Listener order (each list is the order of delivery; written down in docs/architecture.md):

* node events (NodeManager): resource cache (the node's report row exists before anyone
  reads it) -> raylet client pool (a dead node's channels close) -> health checker ->
  jobs (a dead driver's jobs finish) -> virtual clusters -> placement-group scheduler ->
  autoscaler state (a drained node's DrainNode call ends) -> syncer -> actors;
* job events (JobManager): virtual clusters (``check_job`` may refuse the job first) ->
  placement-group scheduler -> task-failure marker -> runtime-env pins -> actors;
* placement-group events: virtual clusters -> placement-group scheduler;
* worker events (WorkerManager): task-failure marker -> actors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gcs.base.clock import Clock
from gcs.base.lifecycle import Component
from gcs.config import GcsConfig
from gcs.managers.cluster_meta import ClusterIdentity
from gcs.managers.events import (
    JobEvents,
    NodeDeathListener,
    NodeEvents,
    PlacementGroupEvents,
    WorkerEvents,
)
from gcs.managers.lane import ResolvePolicy
from gcs.managers.task_failures import TaskFailureMarker
from gcs.proto import gcs_pb2
from gcs.rpc.raylet_io.actors import ActorGateway
from gcs.rpc.raylet_io.gateway import RayletGateway
from gcs.rpc.security import Security
from gcs.server.extras import Extras
from gcs.server.gc_policy import GcTuning
from gcs.server.head_processes import HeadChildren
from gcs.server.managers import Managers
from gcs.server.metrics import GcsMetrics
from gcs.server.rpc_server import Prepared, RpcServer
from gcs.server.wiring_components import (
    Built,
    extra_components,
    gcs_components,
    head_children,
    serving,
    store_and_metrics,
)
from gcs.server.wiring_managers import Context, Events, build_managers
from gcs.store import Store

__all__ = ["Extras", "Wiring", "build"]


@dataclass(slots=True)
class Wiring:
    managers: Managers
    identity: ClusterIdentity
    rpc: RpcServer
    gc: GcTuning
    children: HeadChildren
    components: list[Component]
    """In load order; the supervisor closes them in reverse."""
    node_events: NodeEvents
    job_events: JobEvents
    pg_events: PlacementGroupEvents
    worker_events: WorkerEvents


def build(
    config: GcsConfig,
    *,
    store: Store,
    owns_store: bool,
    clock: Clock,
    security: Security,
    metrics: GcsMetrics,
    advertised_host: str,
    lane_policy: ResolvePolicy | None = None,
    raylets: RayletGateway | None = None,
    actor_gateway: ActorGateway | None = None,
    extras: Extras | None = None,
    admit: Callable[[], bool] | None = None,
    start_heap_frozen: bool = False,
    prepared: Prepared | None = None,
) -> Wiring:
    """``store``: the backend, opened at load (``owns_store``: closed at the end too);
    managers get it metered.  ``raylets`` / ``actor_gateway``: fakes in tests.  ``admit``
    (``--ha``, one leader term of ``gcs.server.ha``): asked per call whether this GCS still
    holds the lease; the port is then shared (SO_REUSEPORT).  ``start_heap_frozen``: the
    process froze its start-up heap before (``gcs.server.gc_policy.GcTuning``).
    ``prepared``: the RPC server's parts built ahead (an HA standby's)."""
    extras = extras or Extras()
    ctx = Context(config, metrics.metered(store), clock, security, lane_policy)
    events = Events(NodeEvents(), JobEvents(), PlacementGroupEvents(), WorkerEvents())
    built = build_managers(ctx, events, extras, raylets, actor_gateway)
    managers, identity = built.managers, built.identity
    _subscribe(events, managers, built.task_failures, built.io.raylets)
    served = serving(ctx, managers, identity, metrics, advertised_host, admit, prepared)
    children = head_children(ctx, identity, served.rpc, advertised_host)
    gc = GcTuning(
        clock,
        gen0_threshold=config.gc_gen0_threshold,
        gen1_threshold=config.gc_gen1_threshold,
        freeze_survivors=config.gc_freeze_survivors,
        start_heap_frozen=start_heap_frozen,
    )
    parts = Built(managers, identity, served, built.io, built.task_failures, gc, children)
    components = [
        *store_and_metrics(ctx, store, owns_store, metrics, parts),
        *gcs_components(ctx, parts, metrics, advertised_host),
        *extra_components(ctx, extras, store, metrics, served.rpc),
    ]
    return Wiring(
        managers,
        identity,
        served.rpc,
        gc,
        children,
        components,
        events.node,
        events.job,
        events.pg,
        events.worker,
    )


# -- listeners, in delivery order (see the module docstring) ----------------------------------
def _subscribe(
    events: Events, m: Managers, task_failures: TaskFailureMarker, raylets: RayletGateway
) -> None:
    events.node.subscribe(
        m.resources,
        _ForgetRaylet(raylets),
        m.health,
        m.jobs.node_listener,
        m.virtual_clusters,
        m.pg_scheduler,
        m.autoscaler,
        m.syncer,
        m.actors.node_listener,
    )
    events.job.subscribe(
        m.virtual_clusters, m.pg_scheduler, task_failures, m.runtime_envs, m.actors.job_listener
    )
    events.pg.subscribe(m.virtual_clusters, m.pg_scheduler)
    events.worker.subscribe(task_failures, m.actors.worker_listener)


class _ForgetRaylet(NodeDeathListener):
    """Node listener: a dead node's raylet connections are closed."""

    def __init__(self, raylets: RayletGateway) -> None:
        self._raylets = raylets

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        self._raylets.forget(node.node_id)
