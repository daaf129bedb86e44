"""Ray-compatible long-poll pubsub: publishers (server side) and an async subscriber client.

See :mod:`gcs.managers.pubsub.publisher` for the protocol and :mod:`gcs.services.pubsub_runtime`
for wiring.
"""

from gcs.base.pubsub_channels import (
    CONTROL_PLANE_CHANNELS,
    GCS_ACTOR_CHANNEL,
    GCS_JOB_CHANNEL,
    GCS_NODE_ADDRESS_AND_LIVENESS_CHANNEL,
    GCS_NODE_INFO_CHANNEL,
    GCS_WORKER_DELTA_CHANNEL,
    OBSERVABILITY_CHANNELS,
    RAY_ERROR_INFO_CHANNEL,
    RAY_LOG_CHANNEL,
    RAY_NODE_RESOURCE_USAGE_CHANNEL,
    RAY_VIRTUAL_CLUSTER_CHANNEL,
)
from gcs.managers.pubsub.config import MailboxLimits, Overflow, PublisherConfig
from gcs.managers.pubsub.publisher import (
    NIL_PUBLISHER_ID,
    Envelope,
    PollReply,
    Publisher,
    PublisherStats,
    SubscriberDropped,
    SweepResult,
)

__all__ = [
    "CONTROL_PLANE_CHANNELS",
    "GCS_ACTOR_CHANNEL",
    "GCS_JOB_CHANNEL",
    "GCS_NODE_ADDRESS_AND_LIVENESS_CHANNEL",
    "GCS_NODE_INFO_CHANNEL",
    "GCS_WORKER_DELTA_CHANNEL",
    "NIL_PUBLISHER_ID",
    "OBSERVABILITY_CHANNELS",
    "RAY_ERROR_INFO_CHANNEL",
    "RAY_LOG_CHANNEL",
    "RAY_NODE_RESOURCE_USAGE_CHANNEL",
    "RAY_VIRTUAL_CLUSTER_CHANNEL",
    "Envelope",
    "MailboxLimits",
    "Overflow",
    "PollReply",
    "Publisher",
    "PublisherConfig",
    "PublisherStats",
    "SubscriberDropped",
    "SweepResult",
]
