"""Ant-ray-compatible virtual clusters: the pure model (no I/O, no clock reads).

Entry points: ``VirtualClusterRegistry`` (operations → ``Plan``), ``replay`` (failover),
``RevisionSource``, ``UsageView``, the ``VcError`` family and the proto conversions.
"""

from gcs.policy.virtual_clusters.errors import StalePlan, VcError, VcStatusCode
from gcs.policy.virtual_clusters.ids import (
    PRIMARY_CLUSTER_ID,
    build_job_cluster_id,
    is_job_cluster_id,
)
from gcs.policy.virtual_clusters.model import Cluster, Kind, NodeInstance, NodeView
from gcs.policy.virtual_clusters.plan import CreateJobClusterResult, CreateOrUpdateResult, Plan
from gcs.policy.virtual_clusters.registry import VirtualClusterRegistry
from gcs.policy.virtual_clusters.replay import ReplayOutcome, replay
from gcs.policy.virtual_clusters.revision import RevisionSource
from gcs.policy.virtual_clusters.usage import StaticUsage, UsageView

__all__ = [
    "PRIMARY_CLUSTER_ID",
    "Cluster",
    "CreateJobClusterResult",
    "CreateOrUpdateResult",
    "Kind",
    "NodeInstance",
    "NodeView",
    "Plan",
    "ReplayOutcome",
    "RevisionSource",
    "StalePlan",
    "StaticUsage",
    "UsageView",
    "VcError",
    "VcStatusCode",
    "VirtualClusterRegistry",
    "build_job_cluster_id",
    "is_job_cluster_id",
    "replay",
]
