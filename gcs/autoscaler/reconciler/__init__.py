"""The reconciler: Ray 2.60's observe-then-act round over the instance manager."""

from gcs.autoscaler.gcs_api import AutoscalerGcs, DrainResult
from gcs.autoscaler.grpc_gcs import GrpcAutoscalerGcs
from gcs.autoscaler.reconciler.events import AutoscalerEvent, EventLog
from gcs.autoscaler.reconciler.observed import ReconcileConfig, ray_nodes_from_state
from gcs.autoscaler.reconciler.reconciler import Reconciler, RoundAborted, RoundResult
from gcs.autoscaler.reconciler.subscribers import CloudInstanceUpdater, RayStopper
from gcs.policy.autoscaling.model import RayNode, RayNodeStatus

__all__ = [
    "AutoscalerEvent",
    "AutoscalerGcs",
    "CloudInstanceUpdater",
    "DrainResult",
    "EventLog",
    "GrpcAutoscalerGcs",
    "RayNode",
    "RayNodeStatus",
    "RayStopper",
    "ReconcileConfig",
    "Reconciler",
    "RoundAborted",
    "RoundResult",
    "ray_nodes_from_state",
]
