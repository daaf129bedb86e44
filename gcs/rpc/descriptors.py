"""Service descriptors by short name (our generated modules, Ray's wire names)."""

from __future__ import annotations

from gcs.proto import (
    autoscaler_pb2,
    core_worker_pb2,
    gcs_service_pb2,
    node_manager_pb2,
    ray_syncer_pb2,
    virtual_cluster_pb2,
)

_GS = gcs_service_pb2.DESCRIPTOR.services_by_name

NODE_INFO = _GS["NodeInfoGcsService"]
NODE_RESOURCE_INFO = _GS["NodeResourceInfoGcsService"]
INTERNAL_KV = _GS["InternalKVGcsService"]
JOB_INFO = _GS["JobInfoGcsService"]
PLACEMENT_GROUP_INFO = _GS["PlacementGroupInfoGcsService"]
CONTROL_PLANE_PUBSUB = _GS["ControlPlanePubSubGcsService"]
OBSERVABILITY_PUBSUB = _GS["ObservabilityPubSubService"]
ACTOR_INFO = _GS["ActorInfoGcsService"]
WORKER_INFO = _GS["WorkerInfoGcsService"]
TASK_INFO = _GS["TaskInfoGcsService"]
RUNTIME_ENV = _GS["RuntimeEnvGcsService"]
AUTOSCALER_STATE = autoscaler_pb2.DESCRIPTOR.services_by_name["AutoscalerStateService"]
NODE_MANAGER = node_manager_pb2.DESCRIPTOR.services_by_name["NodeManagerService"]
RAY_SYNCER = ray_syncer_pb2.DESCRIPTOR.services_by_name["RaySyncer"]
CORE_WORKER = core_worker_pb2.DESCRIPTOR.services_by_name["CoreWorkerService"]
"""Only ``PushTask`` (the GCS pushes actor creation tasks to leased workers)."""
_VC = virtual_cluster_pb2.DESCRIPTOR.services_by_name
VIRTUAL_CLUSTER_INFO = _VC["VirtualClusterInfoGcsService"]

SERVED_BY_GCS = (
    NODE_INFO,
    NODE_RESOURCE_INFO,
    INTERNAL_KV,
    AUTOSCALER_STATE,
    JOB_INFO,
    WORKER_INFO,
    TASK_INFO,
    RUNTIME_ENV,
    PLACEMENT_GROUP_INFO,
    ACTOR_INFO,
    VIRTUAL_CLUSTER_INFO,
    CONTROL_PLANE_PUBSUB,
    OBSERVABILITY_PUBSUB,
    RAY_SYNCER,
)
"""The services ``gcs serve`` answers (the others are UNIMPLEMENTED)."""
