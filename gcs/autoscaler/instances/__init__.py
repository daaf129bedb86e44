"""Instance manager: statuses and transitions as data, versioned storage, one apply lane."""

from gcs.autoscaler.instances.manager import (
    InstanceEvent,
    InstanceManager,
    InstanceSubscriber,
    UpdateResult,
    UpdateStatus,
)
from gcs.autoscaler.instances.model import (
    Instance,
    InstanceUpdate,
    InvalidInstanceUpdate,
    StatusHistory,
    TerminationCause,
)
from gcs.autoscaler.instances.storage import (
    InstanceStorage,
    MemoryInstanceStorage,
    StoreInstanceStorage,
    VersionConflict,
)
from gcs.autoscaler.instances.transitions import (
    VALID_TRANSITIONS,
    is_ray_running_reachable,
    is_valid_transition,
    reachable_from,
)

__all__ = [
    "VALID_TRANSITIONS",
    "Instance",
    "InstanceEvent",
    "InstanceManager",
    "InstanceStorage",
    "InstanceSubscriber",
    "InstanceUpdate",
    "InvalidInstanceUpdate",
    "MemoryInstanceStorage",
    "StatusHistory",
    "StoreInstanceStorage",
    "TerminationCause",
    "UpdateResult",
    "UpdateStatus",
    "VersionConflict",
    "is_ray_running_reachable",
    "is_valid_transition",
    "reachable_from",
]
