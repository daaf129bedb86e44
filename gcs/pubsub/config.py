"""Publisher configuration: hosted channels, batch/size caps, mailbox limits, timeouts.

Defaults are Ray 2.60's (``publish_batch_size`` 5000, ``max_grpc_message_size`` 512 MiB,
``publisher_entity_buffer_max_bytes`` 1 GiB, ``subscriber_timeout_ms`` 300 000).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass

from gcs.pubsub.channels import CONTROL_PLANE_CHANNELS, OBSERVABILITY_CHANNELS

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
    """Everything a :class:`~gcs.pubsub.publisher.Publisher` needs besides a clock."""

    name: str
    """Label for logs and stats (``control_plane`` / ``observability``)."""
    channels: frozenset[int]
    """Channels this publisher hosts; anything else is rejected as InvalidArgument."""
    limits: MailboxLimits
    publish_batch_size: int = 5000
    """Most messages in one poll reply."""
    max_reply_bytes: int = 512 * MIB
    """A poll reply stops before exceeding this (its first message is always included)."""
    max_message_bytes: int = 512 * MIB
    """Larger single messages are dropped (DROP_OLDEST) or rejected (DROP_SUBSCRIBER)."""
    subscriber_timeout_ms: int = 300_000
    """Held polls older than this get an empty reply; idle subscribers are unregistered."""
    max_dropped_tombstones: int = 10_000
    """How many dropped subscriber ids are remembered to fail their next poll."""

    @classmethod
    def control_plane(cls, *, extra_channels: Iterable[int] = ()) -> PublisherConfig:
        """Ray's control-plane publisher: never drops, except past a large safety cap.

        Ray keeps these mailboxes unbounded; we drop a subscriber whose backlog passes
        1 GiB or 1,000,000 messages rather than let one stuck client exhaust memory.
        """
        return cls(
            name="control_plane",
            channels=CONTROL_PLANE_CHANNELS | frozenset(extra_channels),
            limits=MailboxLimits(
                max_bytes=GIB, max_messages=1_000_000, on_overflow=Overflow.DROP_SUBSCRIBER
            ),
        )

    @classmethod
    def observability(cls, *, max_bytes: int = GIB) -> PublisherConfig:
        """Ray's observability publisher: drop oldest beyond a byte budget per subscriber."""
        return cls(
            name="observability",
            channels=OBSERVABILITY_CHANNELS,
            limits=MailboxLimits(
                max_bytes=max_bytes, max_messages=None, on_overflow=Overflow.DROP_OLDEST
            ),
        )

    def with_channels(self, *channels: int) -> PublisherConfig:
        """A copy that also hosts ``channels`` (e.g. ``RAY_VIRTUAL_CLUSTER_CHANNEL``)."""
        return dataclasses.replace(self, channels=self.channels | frozenset(channels))
