"""Pure autoscaling policy: Ray 2.60's decisions, near-linear, with reasons."""

from gcs.autoscaler.scheduler.core import schedule
from gcs.autoscaler.scheduler.types import (
    ClusterConstraint,
    Decision,
    GangRequest,
    InstanceStatus,
    LabelConstraint,
    LabelOp,
    LaunchFailure,
    NodeInstance,
    NodeKind,
    NodeTypeConfig,
    Options,
    ResourceDemand,
    SchedulerConfig,
    SchedulingInput,
    SchedulingReply,
    Termination,
    TerminationCause,
)

__all__ = [
    "ClusterConstraint",
    "Decision",
    "GangRequest",
    "InstanceStatus",
    "LabelConstraint",
    "LabelOp",
    "LaunchFailure",
    "NodeInstance",
    "NodeKind",
    "NodeTypeConfig",
    "Options",
    "ResourceDemand",
    "SchedulerConfig",
    "SchedulingInput",
    "SchedulingReply",
    "Termination",
    "TerminationCause",
    "schedule",
]
