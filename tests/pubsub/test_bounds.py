"""Bounded pubsub memory (issue 12, defect 6): one copy per message, byte caps, GcsPublish limits.

The issue's scenario: two idle subscriptions plus large ``GcsPublish`` calls took the
server from 51 MB to 4.2 GB in 11 s.  Here the publisher's own account of what it holds
(``held_bytes``: each distinct message once) is checked directly after every publish; the
end-to-end RSS check is ``bench/pubsub/memory.py``.
"""

from __future__ import annotations

import dataclasses

import grpc
import pytest
from google.protobuf.message import Message

from gcs.base.clock import FakeClock
from gcs.managers.pubsub import (
    GCS_NODE_INFO_CHANNEL,
    RAY_LOG_CHANNEL,
    MailboxLimits,
    Overflow,
    Publisher,
    PublisherConfig,
    SubscriberDropped,
)
from gcs.proto import gcs_service_pb2, logging_pb2, pubsub_pb2
from gcs.rpc.errors import RayStatusError, status_for
from gcs.services.pubsub import PubSubServicer
from tests.pubsub.helpers import PID, control_plane, node, sub_id

MIB = 1 << 20
A, B, C = sub_id(1), sub_id(2), sub_id(3)


def log_message(i: int, size: int) -> pubsub_pb2.PubMessage:
    msg = pubsub_pb2.PubMessage(channel_type=RAY_LOG_CHANNEL, key_id=b"")
    msg.log_batch_message.CopyFrom(logging_pb2.LogBatch(ip=str(i), lines=["x" * size]))
    return msg


def observability(**overrides: object) -> Publisher:
    cfg = dataclasses.replace(PublisherConfig.observability(), **overrides)  # type: ignore[arg-type]
    return Publisher(cfg, FakeClock(), publisher_id=PID)


def seqs(reply) -> list[int]:  # type: ignore[no-untyped-def]
    return [m.sequence_id for m in reply.to_proto().pub_messages]


class TestOneCopy:
    async def test_a_message_for_two_subscribers_is_held_once_as_bytes(self) -> None:
        """Both mailboxes share one envelope; held bytes count it once; acks free it."""
        pub = control_plane()
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)
        pub.subscribe(B, GCS_NODE_INFO_CHANNEL)
        pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node("a"))
        (env_a,), (env_b,) = pub.queued(A), pub.queued(B)
        assert env_a is env_b
        slots = type(env_a).__slots__
        assert not any(isinstance(getattr(env_a, name), Message) for name in slots)
        assert pub.held_bytes == env_a.size and pub.held_messages == 1
        pub.poll(A, 1, PID)
        assert pub.held_bytes == env_a.size  # B still needs it
        pub.poll(B, 1, PID)
        assert (pub.held_bytes, pub.held_messages) == (0, 0)

    async def test_the_one_message_reply_is_the_same_bytes_for_every_subscriber(self) -> None:
        """Fan-out builds no reply per subscriber: held polls get one shared object."""
        pub = control_plane()
        futures = []
        for i in range(5):
            pub.subscribe(sub_id(i), GCS_NODE_INFO_CHANNEL)
            futures.append(pub.poll(sub_id(i), 0, PID))
        pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node("a"))
        wires = {id(f.result().wire) for f in futures}
        assert len(wires) == 1
        assert seqs(futures[0].result()) == [1]

    def test_a_message_nobody_subscribed_to_is_not_kept(self) -> None:
        pub = control_plane()
        assert pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node("a")) == 1
        assert pub.held_bytes == 0


class TestIssueScenario:
    async def test_two_idle_subscribers_and_large_gcs_publish_stay_under_the_caps(self) -> None:
        """50 x 1 MiB GcsPublish, two subscribers that never poll: bounded, drops counted.

        Per-subscriber cap 4 MiB, global 6 MiB.  Before the fix every message stayed twice
        (proto + bytes) until a 1 GiB per-subscriber cap, and nothing bounded the total.
        """
        pub = observability(
            limits=MailboxLimits(4 * MIB, None, Overflow.DROP_OLDEST),
            max_held_bytes=6 * MIB,
            max_message_bytes=2 * MIB,
            max_publish_request_bytes=2 * MIB,
        )
        servicer = PubSubServicer(pub)
        pub.subscribe(A, RAY_LOG_CHANNEL)
        pub.subscribe(B, RAY_LOG_CHANNEL)
        peak = 0
        for i in range(50):
            request = gcs_service_pb2.GcsPublishRequest(pub_messages=[log_message(i, MIB)])
            await servicer.GcsPublish(request, None)  # type: ignore[arg-type]
            peak = max(peak, pub.held_bytes)
            assert sum(e.size for e in pub.queued(A)) <= 4 * MIB + 4096
        assert peak <= 6 * MIB
        stats = pub.stats()
        assert stats.dropped_messages > 0 and stats.dropped_bytes >= stats.dropped_messages * MIB
        got = seqs(await pub.poll(A, 0, PID))  # the newest survive, in order
        assert got == list(range(51 - len(got), 51)) and 1 <= len(got) <= 4

    async def test_global_cap_drops_the_oldest_across_subscribers_of_different_keys(
        self,
    ) -> None:
        """Each mailbox under its own cap, the total still bounded; pollers skip drops."""
        pub = observability(
            limits=MailboxLimits(None, None, Overflow.DROP_OLDEST), max_held_bytes=3 * MIB
        )
        pub.subscribe(A, RAY_LOG_CHANNEL, b"a")
        pub.subscribe(B, RAY_LOG_CHANNEL, b"b")
        for i in range(20):
            key = b"ab"[i % 2 : i % 2 + 1]
            pub.publish(RAY_LOG_CHANNEL, key, log_message(i, MIB // 2).log_batch_message)
            assert pub.held_bytes <= 3 * MIB
        assert pub.dropped_messages >= 14
        got_a = seqs(await pub.poll(A, 0, PID))
        got_b = seqs(await pub.poll(B, 0, PID))
        assert got_a and got_b and max(got_a + got_b) == 20
        assert all(s % 2 == 1 for s in got_a) and all(s % 2 == 0 for s in got_b)
        assert len(got_a) + len(got_b) <= 6

    async def test_control_plane_global_cap_drops_the_laggard_not_its_messages(self) -> None:
        """Control-plane messages are never silently lost: the stuck subscriber goes."""
        pub = control_plane(
            limits=MailboxLimits(None, None, Overflow.DROP_SUBSCRIBER), max_held_bytes=64 * 1024
        )
        pub.subscribe(A, GCS_NODE_INFO_CHANNEL)  # never polls
        pub.subscribe(B, GCS_NODE_INFO_CHANNEL)  # keeps up
        big = "x" * 8192
        for i in range(20):
            pub.publish(GCS_NODE_INFO_CHANNEL, b"k", node(f"{i}{big}"))
            pub.poll(B, i + 1, PID)
            assert pub.held_bytes <= 64 * 1024
        assert not pub.has_subscriber(A) and pub.has_subscriber(B)
        assert pub.dropped_subscribers == 1 and pub.dropped_messages == 0
        with pytest.raises(SubscriberDropped):
            pub.poll(A, 0, PID)


class TestPublishLimits:
    async def test_an_oversized_message_is_rejected_naming_it_and_nothing_is_published(
        self,
    ) -> None:
        pub = observability(max_message_bytes=1000)
        pub.subscribe(A, RAY_LOG_CHANNEL)
        request = gcs_service_pb2.GcsPublishRequest(
            pub_messages=[log_message(0, 10), log_message(1, 5000)]
        )
        with pytest.raises(RayStatusError) as info:
            await PubSubServicer(pub).GcsPublish(request, None)  # type: ignore[arg-type]
        code, details = status_for(info.value)  # type: ignore[misc]
        assert (code, details) == (grpc.StatusCode.ABORTED, "InvalidArgument")  # Ray's form
        assert info.value.message.startswith("GcsPublishRequest.pub_messages[1]")
        assert "max_message_bytes" in info.value.message
        assert pub.last_sequence_id == 0 and pub.held_bytes == 0

    async def test_an_oversized_request_is_rejected_naming_the_limit(self) -> None:
        pub = observability(max_publish_request_bytes=4000, max_message_bytes=3000)
        request = gcs_service_pb2.GcsPublishRequest(
            pub_messages=[log_message(i, 1000) for i in range(5)]
        )
        with pytest.raises(RayStatusError) as info:
            await PubSubServicer(pub).GcsPublish(request, None)  # type: ignore[arg-type]
        assert "max_publish_request_bytes" in info.value.message
        assert pub.last_sequence_id == 0

    def test_caps_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="max_held_bytes"):
            dataclasses.replace(PublisherConfig.observability(), max_held_bytes=0)

    def test_defaults_bound_both_publishers(self) -> None:
        """A stuck client can no longer pin gigabytes: every default cap is finite."""
        for cfg in (PublisherConfig.control_plane(), PublisherConfig.observability()):
            assert cfg.max_held_bytes is not None and cfg.max_held_bytes <= 512 * MIB
            assert cfg.limits.max_bytes is not None and cfg.limits.max_bytes <= 256 * MIB
            assert cfg.max_message_bytes <= cfg.max_publish_request_bytes <= 64 * MIB


class TestMetrics:
    async def test_held_bytes_and_drops_are_exported_per_publisher(self) -> None:
        from prometheus_client import generate_latest

        from gcs.server.metrics import GcsMetrics, pubsub_families

        pub = observability(
            limits=MailboxLimits(1000, None, Overflow.DROP_OLDEST), max_message_bytes=1000
        )
        pub.subscribe(A, RAY_LOG_CHANNEL)
        for i in range(3):
            pub.publish(RAY_LOG_CHANNEL, b"", log_message(i, 600).log_batch_message)
        metrics = GcsMetrics()
        metrics.add_source(lambda: pubsub_families({"observability": pub.stats()}))
        text = generate_latest(metrics.registry).decode()
        assert f'gcs_pubsub_held_bytes{{publisher="observability"}} {float(pub.held_bytes)}' in text
        assert 'gcs_pubsub_dropped_messages_total{publisher="observability"} 2.0' in text
