"""Publisher configuration: hosted channels, batch/size caps, memory caps, timeouts.

Ray 2.60's defaults where Ray has the knob: ``publish_batch_size`` 5000, a reply stops
before ``max_grpc_message_size`` (512 MiB), ``subscriber_timeout_ms`` 300 000.  Ray bounds
only the observability channels, by ``publisher_entity_buffer_max_bytes`` (1 GiB per
subscribed entity, dropping the oldest) and drops single messages over 512 MiB; its
control-plane buffers are unbounded.  We bound every publisher, lower: one subscriber's
backlog (:class:`MailboxLimits`), all held messages together (``max_held_bytes``, each
message counted once), one message and one ``GcsPublish`` request.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass

from gcs.base.pubsub_channels import CONTROL_PLANE_CHANNELS, OBSERVABILITY_CHANNELS

GIB = 1 << 30
MIB = 1 << 20


class Overflow(enum.Enum):
    """What happens when a subscriber's mailbox exceeds its limits."""

    DROP_OLDEST = "drop_oldest"
    """Discard the oldest unacknowledged messages (Ray's observability channels)."""
    DROP_SUBSCRIBER = "drop_subscriber"
    """Unregister the lagging subscriber; its next poll fails once with ABORTED "NotFound"
    so a client knows it must resubscribe and refetch (control plane safety cap)."""


@dataclass(frozen=True)
class MailboxLimits:
    """Per-subscriber mailbox limits; ``None`` means no limit on that axis."""

    max_bytes: int | None
    """Serialized bytes of unacknowledged messages held for one subscriber."""
    max_messages: int | None
    """Number of unacknowledged messages held for one subscriber."""
    on_overflow: Overflow


@dataclass(frozen=True)
class PublisherConfig:
    """Everything a :class:`~gcs.managers.pubsub.publisher.Publisher` needs besides a clock."""

    name: str
    """Label for logs and stats (``control_plane`` / ``observability``)."""
    channels: frozenset[int]
    """Channels this publisher hosts; anything else is rejected as InvalidArgument."""
    limits: MailboxLimits
    publish_batch_size: int = 5000
    """Most messages in one poll reply."""
    max_reply_bytes: int = 512 * MIB
    """A poll reply stops before exceeding this (its first message is always included)."""
    max_message_bytes: int = 64 * MIB
    """Larger single messages are dropped (DROP_OLDEST) or rejected (DROP_SUBSCRIBER);
    ``GcsPublish`` rejects them with InvalidArgument naming the message."""
    max_held_bytes: int | None = 512 * MIB
    """All messages held for subscribers, each counted once; past it the oldest goes
    (DROP_OLDEST) or the subscribers still holding it are dropped (DROP_SUBSCRIBER)."""
    max_publish_request_bytes: int = 64 * MIB
    """Largest ``GcsPublishRequest`` accepted (serialized size)."""
    subscriber_timeout_ms: int = 300_000
    """Held polls older than this get an empty reply; idle subscribers are unregistered."""
    max_dropped_tombstones: int = 10_000
    """How many dropped subscriber ids are remembered to fail their next poll."""

    def __post_init__(self) -> None:
        limits = self.limits
        for name, value in (
            ("max_message_bytes", self.max_message_bytes),
            ("max_held_bytes", self.max_held_bytes),
            ("max_publish_request_bytes", self.max_publish_request_bytes),
            ("limits.max_bytes", limits.max_bytes),
            ("limits.max_messages", limits.max_messages),
            ("publish_batch_size", self.publish_batch_size),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"{self.name} publisher: {name} must be positive, got {value}")

    @classmethod
    def control_plane(
        cls, *, extra_channels: Iterable[int] = (), max_held_bytes: int = 512 * MIB
    ) -> PublisherConfig:
        """Ray's control-plane publisher: never drops a message a subscriber still needs.

        Ray keeps these mailboxes unbounded; we drop a *subscriber* whose backlog passes
        256 MiB or 1,000,000 messages, or that holds the oldest message when all held
        messages pass ``max_held_bytes``; its next poll fails once with "NotFound" so it
        resubscribes and refetches, rather than one stuck client exhausting memory.
        """
        return cls(
            name="control_plane",
            channels=CONTROL_PLANE_CHANNELS | frozenset(extra_channels),
            limits=MailboxLimits(
                max_bytes=256 * MIB, max_messages=1_000_000, on_overflow=Overflow.DROP_SUBSCRIBER
            ),
            max_held_bytes=max_held_bytes,
        )

    @classmethod
    def observability(
        cls, *, max_bytes: int = 256 * MIB, max_held_bytes: int = 512 * MIB
    ) -> PublisherConfig:
        """Ray's observability publisher: drop oldest beyond a byte budget per subscriber
        (``max_bytes``) and over all subscribers (``max_held_bytes``), counted."""
        return cls(
            name="observability",
            channels=OBSERVABILITY_CHANNELS,
            limits=MailboxLimits(
                max_bytes=max_bytes, max_messages=None, on_overflow=Overflow.DROP_OLDEST
            ),
            max_held_bytes=max_held_bytes,
        )

    def with_channels(self, *channels: int) -> PublisherConfig:
        """A copy that also hosts ``channels`` (e.g. ``RAY_VIRTUAL_CLUSTER_CHANNEL``)."""
        return dataclasses.replace(self, channels=self.channels | frozenset(channels))
