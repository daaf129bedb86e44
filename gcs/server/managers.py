"""The managers of one GCS as the wiring built them (:mod:`gcs.server.wiring`): what the
servicers, the metric families and tests reach through ``GcsServer.managers``."""

from __future__ import annotations

from dataclasses import dataclass

from gcs.managers.actors import ActorManager
from gcs.managers.autoscaler_state import AutoscalerStateManager
from gcs.managers.events import WorkerEvents
from gcs.managers.health import HealthChecker
from gcs.managers.job_view import JobView
from gcs.managers.jobs import JobManager
from gcs.managers.kv import KvManager
from gcs.managers.load_poller import LoadPoller
from gcs.managers.nodes import NodeManager
from gcs.managers.pg_scheduler import PlacementGroupScheduler
from gcs.managers.placement_groups import PlacementGroupManager
from gcs.managers.resources import ResourceCache
from gcs.managers.runtime_env import RuntimeEnvPins
from gcs.managers.sync_hub import SyncHub
from gcs.managers.tasks import TaskEventStore
from gcs.managers.virtual_clusters import VirtualClusterManager
from gcs.managers.workers import WorkerManager
from gcs.rpc.raylet_io.gateway import RayletGateway
from gcs.services.pubsub_runtime import GcsPubSub

__all__ = ["Managers"]


@dataclass(slots=True)
class Managers:
    kv: KvManager
    nodes: NodeManager
    resources: ResourceCache
    placement_groups: PlacementGroupManager
    pg_scheduler: PlacementGroupScheduler
    jobs: JobManager
    autoscaler: AutoscalerStateManager
    health: HealthChecker
    poller: LoadPoller
    raylets: RayletGateway
    pubsub: GcsPubSub
    virtual_clusters: VirtualClusterManager
    syncer: SyncHub
    workers: WorkerManager
    tasks: TaskEventStore
    runtime_envs: RuntimeEnvPins
    actors: ActorManager
    worker_events: WorkerEvents
    """Emit worker deaths here (``ReportWorkerFailure``): the actor manager listens."""
    job_view: JobView
    """``GetAllJobInfo``'s answer: the JOB table with the job API's records and the drivers'
    pending tasks."""
