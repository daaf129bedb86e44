"""Channel numbers, which publisher hosts which channel, and where each payload goes.

Numbers are Ray 2.60's ``ChannelType``; the virtual-cluster channel keeps ant-ray's 11 (Ray
2.60 leaves it unused).  If this checkout's ``pubsub.proto`` does not define it yet we use the
bare int, so the control-plane publisher can host it either way.
"""

from __future__ import annotations

from google.protobuf.message import Message

from gcs.proto import pubsub_pb2

_CT = pubsub_pb2.ChannelType


def _channel(name: str, fallback: int) -> int:
    return _CT.Value(name) if name in _CT.DESCRIPTOR.values_by_name else fallback


GCS_ACTOR_CHANNEL = _CT.Value("GCS_ACTOR_CHANNEL")
GCS_JOB_CHANNEL = _CT.Value("GCS_JOB_CHANNEL")
GCS_NODE_INFO_CHANNEL = _CT.Value("GCS_NODE_INFO_CHANNEL")
GCS_WORKER_DELTA_CHANNEL = _CT.Value("GCS_WORKER_DELTA_CHANNEL")
RAY_ERROR_INFO_CHANNEL = _CT.Value("RAY_ERROR_INFO_CHANNEL")
RAY_LOG_CHANNEL = _CT.Value("RAY_LOG_CHANNEL")
RAY_NODE_RESOURCE_USAGE_CHANNEL = _CT.Value("RAY_NODE_RESOURCE_USAGE_CHANNEL")
GCS_NODE_ADDRESS_AND_LIVENESS_CHANNEL = _CT.Value("GCS_NODE_ADDRESS_AND_LIVENESS_CHANNEL")
RAY_VIRTUAL_CLUSTER_CHANNEL = _channel("RAY_VIRTUAL_CLUSTER_CHANNEL", 11)

CONTROL_PLANE_CHANNELS: frozenset[int] = frozenset(
    {
        GCS_NODE_ADDRESS_AND_LIVENESS_CHANNEL,
        GCS_NODE_INFO_CHANNEL,
        GCS_WORKER_DELTA_CHANNEL,
        GCS_ACTOR_CHANNEL,
        GCS_JOB_CHANNEL,
    }
)
"""Channels of ``ControlPlanePubSubGcsService`` in Ray 2.60 (add channel 11 for VCs)."""

OBSERVABILITY_CHANNELS: frozenset[int] = frozenset(
    {RAY_ERROR_INFO_CHANNEL, RAY_LOG_CHANNEL, RAY_NODE_RESOURCE_USAGE_CHANNEL}
)
"""Channels of ``ObservabilityPubSubService`` in Ray 2.60."""

_PAYLOAD_FIELDS: dict[int, str] = {
    GCS_ACTOR_CHANNEL: "actor_message",
    GCS_JOB_CHANNEL: "job_message",
    GCS_NODE_INFO_CHANNEL: "node_info_message",
    GCS_WORKER_DELTA_CHANNEL: "worker_delta_message",
    RAY_ERROR_INFO_CHANNEL: "error_info_message",
    RAY_LOG_CHANNEL: "log_batch_message",
    RAY_NODE_RESOURCE_USAGE_CHANNEL: "node_resource_usage_message",
    GCS_NODE_ADDRESS_AND_LIVENESS_CHANNEL: "node_address_and_liveness_message",
    RAY_VIRTUAL_CLUSTER_CHANNEL: "virtual_cluster_message",
}


def channel_name(channel: int) -> str:
    """Enum name if this checkout knows it, else ``CHANNEL_<n>``."""
    try:
        return _CT.Name(channel)
    except ValueError:
        return f"CHANNEL_{channel}"


def payload_field(channel: int) -> str | None:
    """The ``PubMessage`` oneof field carrying this channel's payload, if the proto has it."""
    name = _PAYLOAD_FIELDS.get(channel)
    if name is None or name not in pubsub_pb2.PubMessage.DESCRIPTOR.fields_by_name:
        return None
    return name


def wrap(channel: int, key_id: bytes, payload: Message) -> pubsub_pb2.PubMessage:
    """A fresh ``PubMessage`` with ``payload`` in the field its channel uses.

    ``payload`` may already be a ``PubMessage`` (as received by ``GcsPublish``); it is copied,
    never mutated, and its channel/key are overwritten by the arguments.
    """
    msg = pubsub_pb2.PubMessage()
    if isinstance(payload, pubsub_pb2.PubMessage):
        msg.CopyFrom(payload)
    else:
        field = payload_field(channel)
        if field is None:
            raise ValueError(f"no PubMessage field for channel {channel_name(channel)}")
        getattr(msg, field).CopyFrom(payload)
    msg.channel_type = channel  # type: ignore[assignment]
    msg.key_id = key_id
    return msg


PUBLISHER_ID_BYTES = 28
NIL_PUBLISHER_ID = b"\xff" * PUBLISHER_ID_BYTES
"""Ray's "no publisher yet": a subscriber's first poll names it."""
