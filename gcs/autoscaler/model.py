"""The autoscaler's shared vocabulary: instance statuses, node kinds, Ray nodes as observed.

Values only, no behaviour and no imports from the rest of the autoscaler, so every layer
can use them.  The layers of ``gcs.autoscaler``, lowest first (a module imports only from
its own layer or the ones before it):

1. ``model`` (this module), ``providers.registry`` (provider names only);
2. ``scheduler`` -- the pure policy;
3. ``config`` (cluster YAML), ``cluster_state`` (ClusterResourceState -> scheduler input);
4. ``instances`` -- the instance records, their lifecycle table and storage;
5. ``gcs_api`` (what the autoscaler asks of a GCS), ``grpc_gcs`` (that, over gRPC);
6. ``providers`` -- the cloud behind one contract (``providers.base``);
7. ``reconciler`` -- one round: observe, decide (scheduler), act (instances, providers);
8. ``runtime``, ``metrics``, ``simulator`` -- the reconciler in a loop: the component
   embedded in ``gcs serve`` / the standalone autoscaler, and the simulated cloud;
9. ``planner``, ``cli``, ``run_cli`` -- the command line.

Outside the package the autoscaler uses ``gcs.clock``, ``gcs.errors``, ``gcs.proto``,
``gcs.rpc`` (client side), ``gcs.store`` and ``gcs.virtual_clusters.ids``; never
``gcs.server``, ``gcs.managers`` or ``gcs.services``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "HEAD_RESOURCE",
    "InstanceStatus",
    "NodeKind",
    "RayNode",
    "RayNodeStatus",
]

HEAD_RESOURCE = "node:__internal_head__"
"""The resource only the head node's raylet reports."""


class InstanceStatus(enum.IntEnum):
    """Instance manager status (numbers as Ray's Instance.InstanceStatus)."""

    UNKNOWN = 0
    QUEUED = 1
    REQUESTED = 2
    ALLOCATED = 3
    RAY_INSTALLING = 4
    RAY_RUNNING = 5
    RAY_STOP_REQUESTED = 6
    RAY_STOPPING = 7
    RAY_STOPPED = 8
    TERMINATING = 9
    TERMINATED = 10
    ALLOCATION_FAILED = 11
    RAY_INSTALL_FAILED = 12
    TERMINATION_FAILED = 13
    ALLOCATION_TIMEOUT = 14


class NodeKind(enum.Enum):
    HEAD = "HEAD"
    WORKER = "WORKER"


class RayNodeStatus(enum.Enum):
    """A node's status as the GCS reports it (numbers as Ray's NodeStatus)."""

    UNSPECIFIED = 0
    RUNNING = 1
    DEAD = 2
    IDLE = 3
    DRAINING = 4


@dataclass(frozen=True, slots=True)
class RayNode:
    """One node of the GCS's ClusterResourceState."""

    node_id: str
    """Hex Ray node id."""
    status: RayNodeStatus
    instance_id: str = ""
    """The cloud instance id the raylet reports (its ``instance_id``); "" if unmanaged."""
    node_type: str = ""
    is_head: bool = False
    total: Mapping[str, float] = field(default_factory=dict)
    available: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    idle_duration_ms: int = 0
    ip_address: str = ""
