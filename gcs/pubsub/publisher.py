"""Ray's long-poll publisher: mailboxes, sequence ids, acking, held polls, sweeping.

One :class:`Publisher` per pubsub service.  It owns a random 28-byte publisher id (new on
every start, so subscribers notice a GCS restart) and one sequence counter for all of its
channels.  Each subscriber has a mailbox of unacknowledged messages; a poll acknowledges
everything up to ``max_processed_sequence_id`` and gets the rest at once, or is *held*
until a publish, a newer poll (which flushes it empty) or the sweep.

Cost model: ``publish`` touches only the subscribers interested in (channel, key): they are
indexed by channel for "all keys" and by (channel, key) for single keys.  It never waits
on a subscriber; a held poll is completed by resolving its future.  Each message is
serialized once into a ready-to-send reply frame shared by every mailbox holding it.

No I/O and no clock reads outside ``clock``: poll returns an :class:`asyncio.Future`
for the servicer to await; :meth:`sweep` takes the time as an argument.
"""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import structlog
from google.protobuf.message import Message

from gcs.clock import Clock
from gcs.proto import gcs_service_pb2, pubsub_pb2
from gcs.pubsub.channels import channel_name, wrap
from gcs.pubsub.config import Overflow, PublisherConfig
from gcs.rpc.errors import InvalidArgument, RayStatusCode, RayStatusError
from gcs.wire_encoding import varint

log = structlog.get_logger("gcs.pubsub")

PUBLISHER_ID_BYTES = 28
NIL_PUBLISHER_ID = b"\xff" * PUBLISHER_ID_BYTES
"""What a Ray subscriber sends before it has seen any reply."""

_ALL_KEYS = b""


_PUB_MESSAGES_TAG = b"\x0a"  # GcsSubscriberPollReply.pub_messages = 1, length-delimited
_PUBLISHER_ID_TAG = b"\x12"  # publisher_id = 2, bytes
_OK_STATUS = b"\xa2\x06\x00"  # status = 100, an empty GcsStatus (code OK), as Ray sends


class SubscriberDropped(RayStatusError):
    """The subscriber was unregistered for lagging; it must resubscribe and refetch."""

    def __init__(self, subscriber_id: bytes) -> None:
        super().__init__(
            RayStatusCode.NotFound,
            f"subscriber {subscriber_id.hex()} was dropped for lagging; resubscribe",
        )


@dataclass(frozen=True, slots=True)
class Envelope:
    """One published message, shared by every mailbox that holds it."""

    sequence_id: int
    channel: int
    key_id: bytes
    message: pubsub_pb2.PubMessage
    frame: bytes
    """``pub_messages`` field bytes for a poll reply: tag, length, serialized message."""

    @property
    def size(self) -> int:
        return len(self.frame)


@dataclass(frozen=True, slots=True)
class PollReply:
    """A poll's answer; ``encode()`` gives ``GcsSubscriberPollReply`` wire bytes."""

    publisher_id: bytes
    messages: tuple[Envelope, ...] = ()

    def encode(self) -> bytes:
        pid = self.publisher_id
        parts = [env.frame for env in self.messages]
        parts.append(_PUBLISHER_ID_TAG + varint(len(pid)) + pid + _OK_STATUS)
        return b"".join(parts)

    def SerializeToString(self) -> bytes:
        return self.encode()

    def to_proto(self) -> gcs_service_pb2.GcsSubscriberPollReply:
        return gcs_service_pb2.GcsSubscriberPollReply.FromString(self.encode())


@dataclass(frozen=True, slots=True)
class SweepResult:
    flushed_polls: int
    removed_subscribers: int


@dataclass(frozen=True, slots=True)
class PublisherStats:
    publisher_id: bytes
    last_sequence_id: int
    subscribers: int
    held_polls: int
    queued_messages: int
    dropped_messages: int
    dropped_subscribers: int


@dataclass(eq=False, slots=True)
class _Subscriber:
    subscriber_id: bytes
    sender_id: bytes
    last_active_s: float
    mailbox: collections.deque[Envelope] = field(default_factory=collections.deque)
    mailbox_bytes: int = 0
    subscriptions: set[tuple[int, bytes]] = field(default_factory=set)
    """(channel, key); key ``b""`` means every key of the channel."""
    held: asyncio.Future[PollReply] | None = None
    held_since_s: float = 0.0

    def holding(self) -> bool:
        return self.held is not None and not self.held.done()

    def ack(self, max_processed: int) -> None:
        box = self.mailbox
        while box and box[0].sequence_id <= max_processed:
            self.mailbox_bytes -= box.popleft().size

    def batch(self, max_messages: int, max_bytes: int) -> tuple[Envelope, ...]:
        out: list[Envelope] = []
        total = 0
        for env in self.mailbox:
            if len(out) >= max_messages or (out and total + env.size > max_bytes):
                break
            out.append(env)
            total += env.size
        return tuple(out)


class Publisher:
    """Long-poll publisher for one pubsub service; see the module docstring."""

    def __init__(
        self,
        config: PublisherConfig,
        clock: Clock,
        *,
        publisher_id: bytes | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self.publisher_id = publisher_id or os.urandom(PUBLISHER_ID_BYTES)
        self._seq = 0
        self._subs: dict[bytes, _Subscriber] = {}
        self._by_key: dict[tuple[int, bytes], dict[bytes, _Subscriber]] = {}
        self._by_sender: dict[bytes, set[bytes]] = {}
        self._tombstones: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._dropped_messages = 0
        self._dropped_subscribers = 0
        self._timeout_s = config.subscriber_timeout_ms / 1000.0

    # ---- publishing -------------------------------------------------------------------

    def publish(self, channel: int, key_id: bytes, message: Message) -> int:
        """Queue ``message`` for every subscriber of (channel, key) and wake held polls.

        ``message`` is the channel's payload (e.g. ``GcsNodeInfo``) or a whole
        ``PubMessage``; it is copied.  Returns the assigned sequence id, or 0 if an
        observability message larger than ``max_message_bytes`` was dropped.  Call it only
        after the change is persisted.
        """
        self._check_hosted(channel)
        msg = wrap(channel, key_id, message)
        self._seq += 1
        msg.sequence_id = self._seq
        data = msg.SerializeToString()
        if len(data) > self.config.max_message_bytes:
            if self.config.limits.on_overflow is Overflow.DROP_SUBSCRIBER:
                raise InvalidArgument(
                    f"message of {len(data)} bytes exceeds {self.config.max_message_bytes}"
                )
            self._dropped_messages += 1
            log.warning("pubsub.message_too_large", channel=channel_name(channel), size=len(data))
            return 0
        env = Envelope(
            self._seq, channel, key_id, msg, _PUB_MESSAGES_TAG + varint(len(data)) + data
        )
        lagging: list[_Subscriber] = []
        for sub in self._interested(channel, key_id):
            sub.mailbox.append(env)
            sub.mailbox_bytes += env.size
            if self._over_limit(sub) and self._overflow(sub):
                lagging.append(sub)
                continue
            if sub.held is not None and not sub.held.done():
                self._reply(sub, self._clock.monotonic_s())
        for sub in lagging:
            self._drop_lagging(sub)
        return self._seq

    def publish_message(self, message: pubsub_pb2.PubMessage) -> int:
        """Publish a whole ``PubMessage`` (``GcsPublish``); its ``sequence_id`` is replaced."""
        return self.publish(message.channel_type, message.key_id, message)

    def check_channel(self, channel: int) -> None:
        """Raise ABORTED "InvalidArgument" unless this publisher hosts ``channel``."""
        self._check_hosted(channel)

    def _interested(self, channel: int, key_id: bytes) -> Iterator[_Subscriber]:
        everyone = self._by_key.get((channel, _ALL_KEYS))
        keyed = self._by_key.get((channel, key_id)) if key_id else None
        if not keyed:
            if everyone:
                yield from list(everyone.values())
            return
        if not everyone:
            yield from list(keyed.values())
            return
        merged = dict(everyone)
        merged.update(keyed)
        yield from merged.values()

    def _over_limit(self, sub: _Subscriber) -> bool:
        limits = self.config.limits
        return (limits.max_bytes is not None and sub.mailbox_bytes > limits.max_bytes) or (
            limits.max_messages is not None and len(sub.mailbox) > limits.max_messages
        )

    def _overflow(self, sub: _Subscriber) -> bool:
        """Apply the overflow policy; True if the subscriber must be dropped."""
        if self.config.limits.on_overflow is Overflow.DROP_SUBSCRIBER:
            return True
        while len(sub.mailbox) > 1 and self._over_limit(sub):
            sub.mailbox_bytes -= sub.mailbox.popleft().size
            self._dropped_messages += 1
        return False

    def _drop_lagging(self, sub: _Subscriber) -> None:
        log.warning(
            "pubsub.subscriber_dropped",
            publisher=self.config.name,
            subscriber=sub.subscriber_id.hex(),
            queued=len(sub.mailbox),
            queued_bytes=sub.mailbox_bytes,
        )
        self._dropped_subscribers += 1
        self._remove(sub)
        self._tombstones[sub.subscriber_id] = None
        while len(self._tombstones) > self.config.max_dropped_tombstones:
            self._tombstones.popitem(last=False)

    # ---- subscribing ------------------------------------------------------------------

    def subscribe(
        self, subscriber_id: bytes, channel: int, key_id: bytes = b"", sender_id: bytes = b""
    ) -> None:
        """Register (channel, key) for the subscriber; ``key_id`` empty means all keys."""
        self._check_hosted(channel)
        sub = self._get_or_create(subscriber_id, sender_id)
        sub.subscriptions.add((channel, key_id))
        self._by_key.setdefault((channel, key_id), {})[subscriber_id] = sub

    def unsubscribe(self, subscriber_id: bytes, channel: int, key_id: bytes = b"") -> None:
        """Drop (channel, key); ``key_id`` empty drops the all-keys subscription only."""
        self._check_hosted(channel)
        sub = self._subs.get(subscriber_id)
        if sub is None:
            return
        sub.subscriptions.discard((channel, key_id))
        self._unindex(sub, (channel, key_id))

    def remove_subscriber(self, subscriber_id: bytes) -> None:
        sub = self._subs.get(subscriber_id)
        if sub is not None:
            self._remove(sub)

    def remove_sender(self, sender_id: bytes) -> int:
        """Remove every subscriber registered by ``sender_id`` (e.g. a dead worker)."""
        ids = self._by_sender.pop(sender_id, set())
        for sid in list(ids):
            self.remove_subscriber(sid)
        return len(ids)

    def _check_hosted(self, channel: int) -> None:
        if channel not in self.config.channels:
            raise RayStatusError(
                RayStatusCode.InvalidArgument,
                f"channel {channel_name(channel)} is not hosted by the "
                f"{self.config.name} publisher",
            )

    def _get_or_create(self, subscriber_id: bytes, sender_id: bytes = b"") -> _Subscriber:
        sub = self._subs.get(subscriber_id)
        if sub is None:
            sender = sender_id or subscriber_id
            sub = _Subscriber(subscriber_id, sender, self._clock.monotonic_s())
            self._subs[subscriber_id] = sub
            self._by_sender.setdefault(sender, set()).add(subscriber_id)
        return sub

    def _unindex(self, sub: _Subscriber, key: tuple[int, bytes]) -> None:
        bucket = self._by_key.get(key)
        if bucket is not None:
            bucket.pop(sub.subscriber_id, None)
            if not bucket:
                del self._by_key[key]

    def _remove(self, sub: _Subscriber) -> None:
        for key in sub.subscriptions:
            self._unindex(sub, key)
        sub.subscriptions.clear()
        senders = self._by_sender.get(sub.sender_id)
        if senders is not None:
            senders.discard(sub.subscriber_id)
            if not senders:
                del self._by_sender[sub.sender_id]
        self._subs.pop(sub.subscriber_id, None)
        if sub.holding():
            assert sub.held is not None
            sub.held.set_result(PollReply(self.publisher_id))
        sub.held = None
        sub.mailbox.clear()
        sub.mailbox_bytes = 0

    # ---- polling ----------------------------------------------------------------------

    def poll(
        self, subscriber_id: bytes, max_processed_sequence_id: int, publisher_id: bytes
    ) -> asyncio.Future[PollReply]:
        """Acknowledge, then answer now or hold; the future resolves with the reply.

        Acks count only if ``publisher_id`` is ours (else a subscriber from before a
        restart would ack our fresh sequence ids).  A poll carrying another publisher id
        is answered at once, even if empty, so the client learns our id and can detect a
        restart without waiting for traffic (Ray clients simply poll again).  A pending
        poll of the same subscriber is flushed with an empty reply.  Must be called on the
        event loop that awaits the future.
        """
        if subscriber_id in self._tombstones:
            del self._tombstones[subscriber_id]
            raise SubscriberDropped(subscriber_id)
        now = self._clock.monotonic_s()
        sub = self._get_or_create(subscriber_id)
        sub.last_active_s = now
        if sub.held is not None:
            if not sub.held.done():
                sub.held.set_result(PollReply(self.publisher_id))
            sub.held = None
        ours = publisher_id == self.publisher_id
        if ours:
            sub.ack(max_processed_sequence_id)
        fut: asyncio.Future[PollReply] = asyncio.get_running_loop().create_future()
        sub.held = fut
        sub.held_since_s = now
        if sub.mailbox or not ours:
            self._reply(sub, now)
        return fut

    def _reply(self, sub: _Subscriber, now: float) -> None:
        fut = sub.held
        sub.held = None
        sub.last_active_s = now
        if fut is not None and not fut.done():
            cfg = self.config
            batch = sub.batch(cfg.publish_batch_size, cfg.max_reply_bytes)
            fut.set_result(PollReply(self.publisher_id, batch))

    # ---- maintenance ------------------------------------------------------------------

    def sweep(self, now_s: float) -> SweepResult:
        """Flush polls held for ``subscriber_timeout_ms``; unregister silent subscribers.

        ``now_s`` is monotonic seconds from the publisher's clock.
        """
        flushed = removed = 0
        for sub in list(self._subs.values()):
            if sub.holding():
                if now_s - sub.held_since_s >= self._timeout_s:
                    self._reply_empty(sub, now_s)
                    flushed += 1
            elif now_s - sub.last_active_s >= self._timeout_s:
                self._remove(sub)
                removed += 1
        if flushed or removed:
            log.info("pubsub.sweep", publisher=self.config.name, flushed=flushed, removed=removed)
        return SweepResult(flushed, removed)

    def _reply_empty(self, sub: _Subscriber, now: float) -> None:
        assert sub.held is not None
        sub.held.set_result(PollReply(self.publisher_id))
        sub.held = None
        sub.last_active_s = now

    def close(self) -> None:
        """Answer every held poll with an empty reply (server shutdown)."""
        for sub in self._subs.values():
            if sub.holding():
                self._reply_empty(sub, self._clock.monotonic_s())

    # ---- introspection ----------------------------------------------------------------

    @property
    def last_sequence_id(self) -> int:
        return self._seq

    def has_subscriber(self, subscriber_id: bytes) -> bool:
        return subscriber_id in self._subs

    def subscriptions_of(self, subscriber_id: bytes) -> frozenset[tuple[int, bytes]]:
        sub = self._subs.get(subscriber_id)
        return frozenset(sub.subscriptions) if sub else frozenset()

    def queued(self, subscriber_id: bytes) -> tuple[Envelope, ...]:
        """Unacknowledged messages held for the subscriber, oldest first."""
        sub = self._subs.get(subscriber_id)
        return tuple(sub.mailbox) if sub else ()

    def held_poll_count(self) -> int:
        return sum(1 for s in self._subs.values() if s.holding())

    def stats(self) -> PublisherStats:
        return PublisherStats(
            publisher_id=self.publisher_id,
            last_sequence_id=self._seq,
            subscribers=len(self._subs),
            held_polls=self.held_poll_count(),
            queued_messages=sum(len(s.mailbox) for s in self._subs.values()),
            dropped_messages=self._dropped_messages,
            dropped_subscribers=self._dropped_subscribers,
        )
