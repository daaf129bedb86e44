"""Ray's long-poll publisher: mailboxes, sequence ids, acking, held polls, sweeping, caps.

One :class:`Publisher` per pubsub service.  It owns a random 28-byte publisher id (new on
every start, so subscribers notice a GCS restart) and one sequence counter for all of its
channels.  Each subscriber has a mailbox of unacknowledged messages; a poll acknowledges
everything up to ``max_processed_sequence_id`` and gets the rest at once, or is *held*
until a publish, a newer poll (which flushes it empty) or the sweep.

Memory: a message is kept once, as the bytes of a complete one-message poll reply
(``pub_messages`` field + this publisher's id + OK status), shared by every mailbox holding
it; no protobuf object is retained.  The usual reply (one new message) is those bytes as
they are, the same object for every subscriber; longer replies join slices of them.
Held bytes are bounded twice, like Ray's ``publisher_entity_buffer_max_bytes``: per
subscriber (:class:`~gcs.managers.pubsub.config.MailboxLimits`) and per publisher
(``max_held_bytes``, each distinct message counted once).  Past a cap the oldest message is
dropped and counted (DROP_OLDEST), or, on channels that must not lose messages, the
subscribers holding it are dropped so they resubscribe and refetch (DROP_SUBSCRIBER).

Cost model: ``publish`` touches only the subscribers interested in (channel, key): they are
indexed by channel for "all keys" and by (channel, key) for single keys.  It never waits
on a subscriber; a held poll is completed by resolving its future.

No I/O and no clock reads outside ``clock``: poll returns an :class:`asyncio.Future`
for the servicer to await; :meth:`sweep` takes the time as an argument.
"""

from __future__ import annotations

import asyncio
import collections
import os
from dataclasses import dataclass, field

import structlog
from google.protobuf.message import Message

from gcs.base.clock import Clock
from gcs.base.errors import InvalidArgument, NotFound
from gcs.base.protowire import varint
from gcs.base.pubsub_channels import NIL_PUBLISHER_ID, PUBLISHER_ID_BYTES, channel_name, wrap
from gcs.managers.pubsub.config import Overflow, PublisherConfig
from gcs.proto import gcs_service_pb2, pubsub_pb2

log = structlog.get_logger("gcs.managers.pubsub")

"""What a Ray subscriber sends before it has seen any reply."""

_ALL_KEYS = b""


_PUB_MESSAGES_TAG = b"\x0a"  # GcsSubscriberPollReply.pub_messages = 1, length-delimited
_PUBLISHER_ID_TAG = b"\x12"  # publisher_id = 2, bytes
_OK_STATUS = b"\xa2\x06\x00"  # status = 100, an empty GcsStatus (code OK), as Ray sends


class SubscriberDropped(NotFound):
    """The subscriber was unregistered for lagging; it must resubscribe and refetch."""

    def __init__(self, subscriber_id: bytes) -> None:
        super().__init__(f"subscriber {subscriber_id.hex()} was dropped for lagging; resubscribe")


class Envelope:
    """One published message, shared by every mailbox that holds it.

    ``reply`` is a complete ``GcsSubscriberPollReply`` carrying only this message; its
    first ``message_end`` bytes are the ``pub_messages`` field.  Once no mailbox holds
    the message, or a cap dropped it, ``reply`` is released (``b""``).
    """

    __slots__ = ("channel", "key_id", "message_end", "refs", "reply", "sequence_id", "size")

    def __init__(
        self, sequence_id: int, channel: int, key_id: bytes, reply: bytes, message_end: int
    ) -> None:
        self.sequence_id = sequence_id
        self.channel = channel
        self.key_id = key_id
        self.reply = reply
        self.message_end = message_end
        self.size = len(reply)
        self.refs = 0
        """Mailboxes holding it; at 0 (or when dropped) its bytes stop counting."""

    @property
    def dropped(self) -> bool:
        return not self.reply

    @property
    def message(self) -> pubsub_pb2.PubMessage:
        """The message, decoded on demand (introspection and tests only)."""
        return gcs_service_pb2.GcsSubscriberPollReply.FromString(self.reply).pub_messages[0]

    def __repr__(self) -> str:
        return f"Envelope(seq={self.sequence_id}, channel={self.channel}, size={self.size})"


@dataclass(frozen=True, slots=True)
class PollReply:
    """A poll's answer: the envelopes it carries and its ready ``GcsSubscriberPollReply``
    wire bytes (shared between subscribers when it is one message's own reply)."""

    publisher_id: bytes
    messages: tuple[Envelope, ...]
    wire: bytes

    def encode(self) -> bytes:
        return self.wire

    def SerializeToString(self) -> bytes:
        return self.wire

    def to_proto(self) -> gcs_service_pb2.GcsSubscriberPollReply:
        return gcs_service_pb2.GcsSubscriberPollReply.FromString(self.wire)


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
    """Mailbox entries over all subscribers (a message held by two counts twice)."""
    held_messages: int
    """Distinct messages held by at least one mailbox."""
    held_bytes: int
    """Bytes of those messages, each counted once: what the publisher keeps in memory."""
    dropped_messages: int
    """Messages discarded by a cap or as too large, counted per mailbox (a message two
    subscribers lose counts twice: each missed it)."""
    dropped_bytes: int
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
        pid = self.publisher_id
        self._tail = _PUBLISHER_ID_TAG + varint(len(pid)) + pid + _OK_STATUS
        self._empty_reply = PollReply(pid, (), self._tail)
        self._seq = 0
        self._subs: dict[bytes, _Subscriber] = {}
        self._by_key: dict[tuple[int, bytes], dict[bytes, _Subscriber]] = {}
        self._by_sender: dict[bytes, set[bytes]] = {}
        self._tombstones: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._live: collections.deque[Envelope] = collections.deque()
        """Held messages in sequence order (released ones are skipped when reached)."""
        self._held_bytes = 0
        self._held_messages = 0
        self._dropped_messages = 0
        self._dropped_bytes = 0
        self._dropped_subscribers = 0
        self._timeout_s = config.subscriber_timeout_ms / 1000.0

    # ---- publishing -------------------------------------------------------------------

    def publish(self, channel: int, key_id: bytes, message: Message) -> int:
        """Queue ``message`` for every subscriber of (channel, key) and wake held polls.

        ``message`` is the channel's payload (e.g. ``GcsNodeInfo``) or a whole
        ``PubMessage``; it is not mutated.  Returns the assigned sequence id, or 0 if an
        observability message larger than ``max_message_bytes`` was dropped.  Call it only
        after the change is persisted.
        """
        self._check_hosted(channel)
        msg = wrap(channel, key_id, message)
        self._seq += 1
        msg.sequence_id = self._seq
        data = msg.SerializeToString()
        del msg
        if len(data) > self.config.max_message_bytes:
            if self.config.limits.on_overflow is Overflow.DROP_SUBSCRIBER:
                raise InvalidArgument(
                    f"message of {len(data)} bytes exceeds {self.config.max_message_bytes}"
                )
            self._count_drop(len(data))
            log.warning("pubsub.message_too_large", channel=channel_name(channel), size=len(data))
            return 0
        subs = self._interested(channel, key_id)
        if not subs:
            return self._seq  # nobody to hold it for
        head = _PUB_MESSAGES_TAG + varint(len(data))
        env = Envelope(self._seq, channel, key_id, head + data + self._tail, len(head) + len(data))
        del data
        env.refs = len(subs)
        self._held_bytes += env.size
        self._held_messages += 1
        cap = self.config.max_held_bytes
        if cap is not None:
            live = self._live
            while live and not live[0].reply:  # released since: forget them
                live.popleft()
            live.append(env)
        size = env.size
        limits = self.config.limits
        max_bytes, max_messages = limits.max_bytes, limits.max_messages
        drop_oldest = limits.on_overflow is Overflow.DROP_OLDEST
        lagging: list[_Subscriber] = []
        now = self._clock.monotonic_s()
        solo = PollReply(self.publisher_id, (env,), env.reply)  # shared by most replies
        for sub in subs:
            box = sub.mailbox
            if box and not box[0].reply:  # the global cap dropped its oldest ones
                self._compact(sub)
            box.append(env)
            sub.mailbox_bytes += size
            if (max_bytes is not None and sub.mailbox_bytes > max_bytes) or (
                max_messages is not None and len(box) > max_messages
            ):
                if not drop_oldest:
                    lagging.append(sub)
                    continue
                self._trim(sub)
            held = sub.held
            if held is not None:
                sub.held = None
                if not held.done():
                    sub.last_active_s = now
                    held.set_result(solo if len(box) == 1 else self._batch(sub))
        for sub in lagging:
            self._drop_lagging(sub)
        if cap is not None and self._held_bytes > cap:
            self._enforce_global_cap(cap)
        return self._seq

    def publish_message(self, message: pubsub_pb2.PubMessage) -> int:
        """Publish a whole ``PubMessage`` (``GcsPublish``); its ``sequence_id`` is replaced."""
        return self.publish(message.channel_type, message.key_id, message)

    def check_channel(self, channel: int) -> None:
        """Raise ABORTED "InvalidArgument" unless this publisher hosts ``channel``."""
        self._check_hosted(channel)

    def _interested(self, channel: int, key_id: bytes) -> list[_Subscriber]:
        everyone = self._by_key.get((channel, _ALL_KEYS))
        keyed = self._by_key.get((channel, key_id)) if key_id else None
        if not keyed:
            return list(everyone.values()) if everyone else []
        if not everyone:
            return list(keyed.values())
        merged = dict(everyone)
        merged.update(keyed)
        return list(merged.values())

    # ---- memory accounting ------------------------------------------------------------

    def _release(self, env: Envelope) -> None:
        """A mailbox let go of ``env``; the last one frees its bytes."""
        env.refs -= 1
        if env.refs == 0 and env.reply:
            env.reply = b""
            self._held_bytes -= env.size
            self._held_messages -= 1

    def _pop_front(self, sub: _Subscriber) -> Envelope:
        env = sub.mailbox.popleft()
        sub.mailbox_bytes -= env.size
        self._release(env)
        return env

    def _compact(self, sub: _Subscriber) -> None:
        """Let go of leading messages the global cap dropped (they lead every mailbox)."""
        box = sub.mailbox
        while box and not box[0].reply:
            self._pop_front(sub)

    def _count_drop(self, size: int) -> None:
        self._dropped_messages += 1
        self._dropped_bytes += size

    def _trim(self, sub: _Subscriber) -> None:
        """DROP_OLDEST: discard this subscriber's oldest messages until within its limits.

        The newest message is always kept (``max_message_bytes`` <= the per-subscriber cap
        is checked by the config).  A message other subscribers still hold stays for them.
        """
        limits = self.config.limits
        box = sub.mailbox
        while len(box) > 1 and (
            (limits.max_bytes is not None and sub.mailbox_bytes > limits.max_bytes)
            or (limits.max_messages is not None and len(box) > limits.max_messages)
        ):
            if box[0].reply:  # a message dropped by the global cap was counted then
                self._count_drop(box[0].size)
            self._pop_front(sub)

    def _enforce_global_cap(self, cap: int) -> None:
        """Drop the oldest held messages (or their holders) until at most ``cap`` is held."""
        live = self._live
        while self._held_bytes > cap and live:
            env = live[0]
            if not env.reply:  # released or dropped already
                live.popleft()
                continue
            if env is live[-1]:
                break  # the newest message always stays
            if self.config.limits.on_overflow is Overflow.DROP_OLDEST:
                live.popleft()
                env.reply = b""  # mailboxes skip it and let go of it lazily
                self._held_bytes -= env.size
                self._held_messages -= 1
                self._count_drop(env.size)
                continue
            holders = [s for s in self._subs.values() if s.mailbox and s.mailbox[0] is env]
            if not holders:  # cannot happen: the oldest held message leads its mailboxes
                log.error("pubsub.global_cap_inconsistent", sequence_id=env.sequence_id)
                break
            for sub in holders:
                self._drop_lagging(sub)
        while live and not live[0].reply:
            live.popleft()

    def _drop_lagging(self, sub: _Subscriber) -> None:
        if self._subs.get(sub.subscriber_id) is not sub:
            return  # already dropped in this round
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
            raise InvalidArgument(
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
            sub.held.set_result(self._empty_reply)
        sub.held = None
        while sub.mailbox:
            self._pop_front(sub)

    # ---- polling ----------------------------------------------------------------------

    def poll(
        self, subscriber_id: bytes, max_processed_sequence_id: int, publisher_id: bytes
    ) -> asyncio.Future[PollReply]:
        """Acknowledge, then answer now or hold; the future resolves with the reply.

        Acks count only if ``publisher_id`` is ours (else a subscriber from before a
        restart would ack our fresh sequence ids).  An empty mailbox holds the poll, as
        Ray does, including a subscriber's first poll (nil or empty publisher id) -- except
        a poll naming *another* real publisher id: that client saw a previous GCS, and an
        immediate empty reply lets it detect the restart and resubscribe without waiting
        for traffic it is no longer subscribed to.  A pending poll of the same subscriber
        is flushed with an empty reply.  Must be called on the event loop that awaits the
        future.
        """
        if subscriber_id in self._tombstones:
            del self._tombstones[subscriber_id]
            raise SubscriberDropped(subscriber_id)
        now = self._clock.monotonic_s()
        sub = self._subs.get(subscriber_id)
        if sub is None:
            sub = self._get_or_create(subscriber_id)
        sub.last_active_s = now
        held = sub.held
        if held is not None:
            if not held.done():
                held.set_result(self._empty_reply)
            sub.held = None
        ours = publisher_id == self.publisher_id
        box = sub.mailbox
        if ours:
            while box and box[0].sequence_id <= max_processed_sequence_id:
                self._pop_front(sub)
        fut: asyncio.Future[PollReply] = asyncio.get_running_loop().create_future()
        if box:
            fut.set_result(self._batch(sub))
        elif not ours and publisher_id and publisher_id != NIL_PUBLISHER_ID:
            fut.set_result(self._empty_reply)
        else:
            sub.held = fut
            sub.held_since_s = now
        return fut

    def _batch(self, sub: _Subscriber) -> PollReply:
        """The reply for ``sub``'s mailbox now (it stays queued until acked)."""
        box = sub.mailbox
        if box and not box[0].reply:
            self._compact(sub)
        if not box:
            return self._empty_reply
        first = box[0]
        if len(box) == 1 or self.config.publish_batch_size == 1:
            return PollReply(self.publisher_id, (first,), first.reply)
        cfg = self.config
        out: list[Envelope] = []
        parts: list[memoryview] = []
        total = 0
        for env in box:
            if len(out) >= cfg.publish_batch_size or (
                out and total + env.message_end > cfg.max_reply_bytes
            ):
                break
            out.append(env)
            parts.append(memoryview(env.reply)[: env.message_end])
            total += env.message_end
        if len(out) == 1:
            return PollReply(self.publisher_id, (first,), first.reply)
        parts.append(memoryview(self._tail))
        return PollReply(self.publisher_id, tuple(out), b"".join(parts))

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
        sub.held.set_result(self._empty_reply)
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

    @property
    def held_bytes(self) -> int:
        """Bytes of distinct messages held for subscribers (each counted once)."""
        return self._held_bytes

    @property
    def held_messages(self) -> int:
        return self._held_messages

    @property
    def dropped_messages(self) -> int:
        """Messages discarded by a cap or as too large, since start."""
        return self._dropped_messages

    @property
    def dropped_bytes(self) -> int:
        return self._dropped_bytes

    @property
    def dropped_subscribers(self) -> int:
        return self._dropped_subscribers

    def has_subscriber(self, subscriber_id: bytes) -> bool:
        return subscriber_id in self._subs

    def subscriptions_of(self, subscriber_id: bytes) -> frozenset[tuple[int, bytes]]:
        sub = self._subs.get(subscriber_id)
        return frozenset(sub.subscriptions) if sub else frozenset()

    def queued(self, subscriber_id: bytes) -> tuple[Envelope, ...]:
        """Unacknowledged messages held for the subscriber, oldest first."""
        sub = self._subs.get(subscriber_id)
        return tuple(env for env in sub.mailbox if env.reply) if sub else ()

    def held_poll_count(self) -> int:
        return sum(1 for s in self._subs.values() if s.holding())

    def stats(self) -> PublisherStats:
        return PublisherStats(
            publisher_id=self.publisher_id,
            last_sequence_id=self._seq,
            subscribers=len(self._subs),
            held_polls=self.held_poll_count(),
            queued_messages=sum(
                sum(1 for env in s.mailbox if env.reply) for s in self._subs.values()
            ),
            held_messages=self._held_messages,
            held_bytes=self._held_bytes,
            dropped_messages=self._dropped_messages,
            dropped_bytes=self._dropped_bytes,
            dropped_subscribers=self._dropped_subscribers,
        )
