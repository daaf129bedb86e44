"""Client API for a GCS (ours or Ray's): resource requests and cluster status.

from gcs.sdk import request_resources, get_cluster_status
request_resources(num_cpus=8, bundles=[{"GPU": 1}], address="127.0.0.1:6379")
"""

from gcs.sdk._address import resolve_address
from gcs.sdk._client import AsyncGcsClient, GcsClient
from gcs.sdk._errors import AddressNotFound, GcsSdkError, RpcError
from gcs.sdk._resources import (
    HA_LEADER_KEY,
    HA_NAMESPACE,
    build_constraint_request,
    get_autoscaler_events,
    get_autoscaler_waiting,
    get_autoscaler_waiting_async,
    get_cluster_status,
    get_cluster_status_async,
    get_ha_leader,
    request_resources,
    request_resources_async,
    validate_request,
)
from gcs.sdk._status import ClusterStatusSummary, ResourceDemand

__all__ = [
    "HA_LEADER_KEY",
    "HA_NAMESPACE",
    "AddressNotFound",
    "AsyncGcsClient",
    "ClusterStatusSummary",
    "GcsClient",
    "GcsSdkError",
    "ResourceDemand",
    "RpcError",
    "build_constraint_request",
    "get_autoscaler_events",
    "get_autoscaler_waiting",
    "get_autoscaler_waiting_async",
    "get_cluster_status",
    "get_cluster_status_async",
    "get_ha_leader",
    "request_resources",
    "request_resources_async",
    "resolve_address",
    "validate_request",
]
