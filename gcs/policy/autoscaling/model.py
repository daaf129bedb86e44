"""The autoscaler's shared vocabulary: instance statuses, node kinds, Ray nodes as observed.

Values only, no behaviour and no imports from the rest of the autoscaler, so every layer
can use them (the layers are listed in :mod:`gcs.autoscaler`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "HEAD_RESOURCE",
    "InstanceStatus",
    "LaunchErrorKind",
    "LaunchNodeError",
    "NodeKind",
    "ProviderError",
    "RayNode",
    "RayNodeStatus",
    "TerminateNodeError",
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


class LaunchErrorKind(enum.Enum):
    """Why a launch failed, as far as the provider can tell (Karpenter sorts its launch
    errors the same way).  CAPACITY and QUOTA make the autoscaler hold the node type back
    for a while and use other types (:mod:`gcs.policy.autoscaling.capacity`); ERROR is retried."""

    CAPACITY = "capacity"
    """The cloud has no capacity for this node type right now (insufficient capacity)."""
    QUOTA = "quota"
    """An account quota or limit of the cloud refused it."""
    ERROR = "error"
    """Anything else."""


@dataclass(frozen=True, slots=True)
class LaunchNodeError:
    node_type: str
    count: int
    request_id: str
    timestamp_ns: int
    details: str = ""
    kind: LaunchErrorKind = LaunchErrorKind.ERROR


@dataclass(frozen=True, slots=True)
class TerminateNodeError:
    cloud_instance_id: str
    request_id: str
    timestamp_ns: int
    details: str = ""


ProviderError = LaunchNodeError | TerminateNodeError
"""A failure reported by :meth:`CloudProvider.poll_errors` (data, never raised)."""
