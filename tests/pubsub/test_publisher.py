"""Unit tests of the long-poll publisher (no gRPC)."""

from __future__ import annotations

import pytest

from gcs.base.clock import FakeClock
from gcs.managers.pubsub import (
    GCS_ACTOR_CHANNEL,
    GCS_JOB_CHANNEL,
    GCS_NODE_INFO_CHANNEL,
    NIL_PUBLISHER_ID,
    RAY_LOG_CHANNEL,
    RAY_VIRTUAL_CLUSTER_CHANNEL,
    MailboxLimits,
    Overflow,
    Publisher,
    PublisherConfig,
    SubscriberDropped,
)
from gcs.proto import gcs_pb2, gcs_service_pb2, pubsub_pb2
from gcs.rpc.errors import InvalidArgument, RayStatusError, as_ray_status, grpc_details, status_for
from gcs.services.pubsub import PubSubServicer
from tests.pubsub.helpers import OTHER_PID, PID, control_plane, node, observability, sub_id

A, B = sub_id(1), sub_id(2)


def seqs(reply) -> list[int]:  # type: ignore[no-untyped-def]
    return [env.sequence_id for env in reply.messages]


class TestSequenceIds:
    def test_sequence_ids_start_at_one_and_share_one_counter_across_channels(self) -> None:
        """One counter per publisher: node, job and actor messages number 1, 2, 3."""
        pub = control_plane()
        assert pub.publish(GCS_NODE_INFO_CHANNEL, b"n", node("a")) == 1
        assert pub.publish(GCS_JOB_CHANNEL, b"j", gcs_pb2.JobTableData(job_id=b"j")) == 2
        assert pub.publish(GCS_ACTOR_CHANNEL, b"x", gcs_pb2.ActorTableData()) == 3

    def test_publish_overwrites_a_preset_sequence_id_and_does_not_mutate_input(self) -> None:
        """GcsPublish requests must not choose their sequence id."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        incoming = pubsub_pb2.PubMessage(
            channel_type=GCS_NODE_INFO_CHANNEL, key_id=b"n", sequence_id=99
        )
        incoming.node_info_message.node_name = "a"
        assert pub.publish_message(incoming) == 1
        assert incoming.sequence_id == 99
        assert pub.queued(A)[0].message.sequence_id == 1

    def test_each_publisher_start_gets_a_random_28_byte_id(self) -> None:
        """A new id per start is how subscribers notice a GCS restart."""
        one = Publisher(PublisherConfig.control_plane(), FakeClock())
        two = Publisher(PublisherConfig.control_plane(), FakeClock())
        assert len(one.publisher_id) == 28
        assert one.publisher_id != two.publisher_id


class TestPolling:
    async def test_poll_with_queued_messages_answers_at_once_in_order(self) -> None:
        """Messages come back in sequence order with the publisher id and payload."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        for name in "abc":
            pub.publish(GCS_NODE_INFO_CHANNEL, name.encode(), node(name))
        reply = await pub.poll(A, 0, PID)
        proto = reply.to_proto()
        assert proto.publisher_id == PID
        assert [m.sequence_id for m in proto.pub_messages] == [1, 2, 3]
        assert [m.node_info_message.node_name for m in proto.pub_messages] == ["a", "b", "c"]
        assert proto.pub_messages[0].key_id == b"a"
        assert proto.HasField("status")

    async def test_messages_stay_until_acknowledged_by_a_later_poll(self) -> None:
        """max_processed_sequence_id acks; unacked messages are resent."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        for name in "abc":
            pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node(name))
        assert seqs(await pub.poll(A, 0, PID)) == [1, 2, 3]
        assert seqs(await pub.poll(A, 2, PID)) == [3]
        fut = pub.poll(A, 3, PID)
        assert not fut.done()
        assert pub.queued(A) == ()

    async def test_acks_from_another_publisher_id_are_ignored_and_answered_at_once(
        self,
    ) -> None:
        """After a restart an old max_processed must not ack our fresh sequence ids."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node("a"))
        reply = await pub.poll(A, 50, b"old-publisher".ljust(28, b"\0"))
        assert seqs(reply) == [1]
        assert reply.publisher_id == PID

    @pytest.mark.parametrize("first_id", [NIL_PUBLISHER_ID, b""])
    async def test_a_first_poll_is_held_like_rays_and_carries_our_id_with_the_message(
        self, first_id: bytes
    ) -> None:
        """No extra empty reply per subscriber at subscribe time (it cost a round trip)."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        fut = pub.poll(A, 0, first_id)
        assert not fut.done()
        pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node("a"))
        reply = fut.result()
        assert seqs(reply) == [1] and reply.to_proto().publisher_id == PID

    async def test_a_poll_naming_a_previous_publisher_is_answered_at_once(self) -> None:
        """A client of the GCS before a restart learns the new id without traffic."""
        pub = control_plane()
        reply = await pub.poll(A, 7, OTHER_PID)
        assert reply.messages == () and reply.to_proto().publisher_id == PID

    async def test_held_poll_is_completed_by_a_publish(self) -> None:
        """An empty mailbox holds the poll; the next publish answers it."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        fut = pub.poll(A, 0, PID)
        assert not fut.done()
        pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node("a"))
        assert fut.done()
        assert seqs(fut.result()) == [1]

    async def test_a_new_poll_flushes_the_pending_one_with_an_empty_reply(self) -> None:
        """Only one poll per subscriber is held; the older one ends empty."""
        pub = control_plane()
        first = pub.poll(A, 0, PID)
        second = pub.poll(A, 0, PID)
        assert first.done() and first.result().messages == ()
        assert first.result().publisher_id == PID
        assert not second.done()

    async def test_unknown_subscriber_is_created_by_its_first_poll(self) -> None:
        """Ray creates subscriber state on the fly."""
        pub = control_plane()
        pub.poll(A, 0, PID)
        assert pub.has_subscriber(A)

    async def test_batch_is_capped_by_publish_batch_size(self) -> None:
        """At most publish_batch_size messages per reply; the rest on the next poll."""
        pub = control_plane(publish_batch_size=2)
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        for name in "abcde":
            pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node(name))
        assert seqs(await pub.poll(A, 0, PID)) == [1, 2]
        assert seqs(await pub.poll(A, 2, PID)) == [3, 4]
        assert seqs(await pub.poll(A, 4, PID)) == [5]

    async def test_batch_stops_before_the_reply_size_cap_but_always_sends_one(self) -> None:
        """The first message is always included even if it alone exceeds the cap."""
        pub = control_plane(max_reply_bytes=10)
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        for name in "ab":
            pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node(name))
        assert seqs(await pub.poll(A, 0, PID)) == [1]
        assert seqs(await pub.poll(A, 1, PID)) == [2]

    async def test_a_cancelled_poll_keeps_messages_queued(self) -> None:
        """A client that went away loses nothing: the next poll gets the message."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        fut = pub.poll(A, 0, PID)
        fut.cancel()
        pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node("a"))
        assert seqs(await pub.poll(A, 0, PID)) == [1]


class TestSubscriptions:
    async def test_key_subscription_filters_other_keys(self) -> None:
        """A single-key subscriber only sees its key; an all-keys subscriber sees all."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL, b"n1")
        pub.subscribe(B, GCS_NODE_INFO_CHANNEL)
        pub.publish(GCS_NODE_INFO_CHANNEL, b"n1", node("a"))
        pub.publish(GCS_NODE_INFO_CHANNEL, b"n2", node("b"))
        assert seqs(await pub.poll(A, 0, PID)) == [1]
        assert seqs(await pub.poll(B, 0, PID)) == [1, 2]

    async def test_key_and_all_keys_subscriptions_deliver_a_message_once(self) -> None:
        """Overlapping subscriptions never duplicate a message."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL, b"n1")
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        pub.publish(GCS_NODE_INFO_CHANNEL, b"n1", node("a"))
        assert seqs(await pub.poll(A, 0, PID)) == [1]

    async def test_channels_are_independent(self) -> None:
        """A job subscriber does not receive node messages."""
        pub = control_plane()
        pub.subscribe(A, GCS_JOB_CHANNEL)
        pub.publish(GCS_NODE_INFO_CHANNEL, b"n", node("a"))
        pub.publish(GCS_JOB_CHANNEL, b"j", gcs_pb2.JobTableData(job_id=b"j"))
        assert seqs(await pub.poll(A, 0, PID)) == [2]

    async def test_unsubscribe_stops_new_messages(self) -> None:
        """After unsubscribe nothing new is queued; the poll is held."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        pub.unsubscribe(A, GCS_NODE_INFO_CHANNEL)
        pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node("a"))
        assert not pub.poll(A, 0, PID).done()

    async def test_unsubscribing_all_keys_keeps_single_key_subscriptions(self) -> None:
        """key_id empty names the all-keys subscription only."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL, b"n1")
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        pub.unsubscribe(A, GCS_NODE_INFO_CHANNEL)
        pub.publish(GCS_NODE_INFO_CHANNEL, b"n2", node("b"))
        pub.publish(GCS_NODE_INFO_CHANNEL, b"n1", node("a"))
        assert seqs(await pub.poll(A, 0, PID)) == [2]

    def test_subscribing_to_a_channel_not_hosted_is_aborted_invalid_argument(self) -> None:
        """The publisher raises the domain error; the servicer answers it as Ray does, gRPC
        ABORTED with details starting "InvalidArgument"."""
        pub = control_plane()
        with pytest.raises(InvalidArgument) as info:
            pub.subscribe(A, RAY_LOG_CHANNEL)
        assert grpc_details(as_ray_status(info.value)) == "InvalidArgument"
        assert status_for(as_ray_status(info.value))[0].name == "ABORTED"  # type: ignore[index]
        command = gcs_service_pb2.GcsSubscriberCommandBatchRequest(subscriber_id=A)
        command.commands.add(channel_type=RAY_LOG_CHANNEL).subscribe_message.SetInParent()
        with pytest.raises(RayStatusError) as wire:
            PubSubServicer(pub).command_batch(command)
        assert grpc_details(wire.value) == "InvalidArgument"
        assert wire.value.message.startswith("channel")

    def test_virtual_cluster_channel_is_hosted_only_when_configured(self) -> None:
        """Channel 11 can be added by configuration."""
        assert RAY_VIRTUAL_CLUSTER_CHANNEL == 11
        plain = control_plane()
        with pytest.raises(InvalidArgument):
            plain.subscribe(A, RAY_VIRTUAL_CLUSTER_CHANNEL)
        cfg = PublisherConfig.control_plane().with_channels(RAY_VIRTUAL_CLUSTER_CHANNEL)
        Publisher(cfg, FakeClock()).subscribe(A, RAY_VIRTUAL_CLUSTER_CHANNEL)

    async def test_remove_sender_drops_all_its_subscribers(self) -> None:
        """sender_id groups subscribers so a dead worker's ones can be removed."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL, sender_id=b"w")
        pub.subscribe(B, GCS_JOB_CHANNEL, sender_id=b"w")
        pub.subscribe(sub_id(3), GCS_JOB_CHANNEL)
        assert pub.remove_sender(b"w") == 2
        assert not pub.has_subscriber(A) and not pub.has_subscriber(B)
        assert pub.has_subscriber(sub_id(3))


class TestBuffers:
    async def test_observability_mailbox_drops_oldest_beyond_its_byte_budget(self) -> None:
        """RAY_LOG keeps the newest messages within the budget."""
        pub = observability(limits=MailboxLimits(300, None, Overflow.DROP_OLDEST))
        pub.subscribe(A, RAY_LOG_CHANNEL)
        for i in range(10):
            pub.publish(RAY_LOG_CHANNEL, b"", _log(i, 100))
        got = seqs(await pub.poll(A, 0, PID))
        assert got == list(range(11 - len(got), 11))
        assert 1 <= len(got) < 10
        assert sum(e.size for e in pub.queued(A)) <= 300
        assert pub.stats().dropped_messages == 10 - len(got)

    async def test_observability_drops_single_messages_larger_than_the_cap(self) -> None:
        """An oversized message is dropped, not queued."""
        pub = observability(max_message_bytes=50)
        pub.subscribe(A, RAY_LOG_CHANNEL)
        assert pub.publish(RAY_LOG_CHANNEL, b"", _log(0, 100)) == 0
        assert pub.queued(A) == ()

    async def test_control_plane_never_drops_below_the_safety_cap(self) -> None:
        """Control-plane mailboxes keep everything a slow subscriber has not acked."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        for i in range(2000):
            pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node(str(i)))
        assert len(pub.queued(A)) == 2000

    async def test_control_plane_subscriber_past_the_safety_cap_is_dropped(self) -> None:
        """It is unregistered, its held state freed, and its next poll fails once."""
        pub = control_plane(limits=MailboxLimits(None, 3, Overflow.DROP_SUBSCRIBER))
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        pub.subscribe(B, GCS_NODE_INFO_CHANNEL)
        for i in range(4):
            pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node(str(i)))
            if i < 3:  # B keeps up
                await pub.poll(B, i, PID)
        assert not pub.has_subscriber(A)
        assert pub.stats().dropped_subscribers == 1
        with pytest.raises(SubscriberDropped) as info:
            pub.poll(A, 0, PID)
        assert grpc_details(as_ray_status(info.value)).startswith("NotFound")
        assert not pub.poll(A, 0, PID).done()  # then it is a fresh subscriber
        assert seqs(await pub.poll(B, 3, PID)) == [4]


class TestSweep:
    async def test_sweep_flushes_polls_held_longer_than_the_timeout(self) -> None:
        """Held polls end empty after subscriber_timeout_ms; younger ones stay."""
        clock = FakeClock()
        pub = control_plane(clock)
        old = pub.poll(A, 0, PID)
        clock.advance(200)
        young = pub.poll(B, 0, PID)
        clock.advance(100)
        result = pub.sweep(clock.monotonic_s())
        assert result.flushed_polls == 1
        assert old.done() and old.result().messages == () and old.result().publisher_id == PID
        assert not young.done()

    async def test_sweep_unregisters_subscribers_that_stopped_polling(self) -> None:
        """No poll for the timeout → state removed; an active subscriber stays."""
        clock = FakeClock()
        pub = control_plane(clock)
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        assert (await pub.poll(B, 0, OTHER_PID)).publisher_id == PID  # answered at once
        clock.advance(299)
        assert pub.sweep(clock.monotonic_s()).removed_subscribers == 0
        pub.poll(B, 0, PID)
        clock.advance(1)
        assert pub.sweep(clock.monotonic_s()).removed_subscribers == 1
        assert not pub.has_subscriber(A) and pub.has_subscriber(B)
        pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node("a"))
        assert pub.stats().queued_messages == 0


def _log(i: int, size: int) -> object:
    from gcs.proto import logging_pb2

    return logging_pb2.LogBatch(ip=str(i), lines=["x" * size])
