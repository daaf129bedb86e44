"""The pubsub services over a real grpc.aio server, and the subscriber client against them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from gcs.base.clock import SystemClock
from gcs.managers.pubsub import (
    GCS_JOB_CHANNEL,
    GCS_NODE_INFO_CHANNEL,
    NIL_PUBLISHER_ID,
    RAY_ERROR_INFO_CHANNEL,
    RAY_LOG_CHANNEL,
)
from gcs.proto import gcs_pb2, gcs_service_pb2, logging_pb2, pubsub_pb2
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import CONTROL_PLANE_PUBSUB, OBSERVABILITY_PUBSUB
from gcs.sdk._subscriber import (
    FAST_RECONNECT_OPTIONS,
    GcsSubscriber,
    SubscribeError,
    SubscriberConfig,
)
from gcs.services.pubsub_runtime import GcsPubSub
from tests.conftest import Seen
from tests.pubsub.helpers import node, sub_id, watch_polls

FAST = SubscriberConfig(initial_backoff_s=0.05, max_backoff_s=0.2)


async def serve(pubsub: GcsPubSub, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(pubsub.handlers())
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await pubsub.start()
    return server, bound


class Gcs:
    """A pubsub-only GCS on a free port."""

    def __init__(self) -> None:
        self.pubsub = GcsPubSub.create(SystemClock())
        self.server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self, port: int = 0) -> None:
        self.server, self.port = await serve(self.pubsub, port)

    async def stop(self) -> None:
        await self.pubsub.stop()
        if self.server is not None:
            await self.server.stop(grace=None)


@pytest.fixture
async def gcs() -> AsyncIterator[Gcs]:
    g = Gcs()
    await g.start()
    yield g
    await g.stop()


@pytest.fixture
async def channel(gcs: Gcs) -> AsyncIterator[grpc.aio.Channel]:
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{gcs.port}", options=FAST_RECONNECT_OPTIONS)
    yield ch
    await ch.close()


class TestServicers:
    async def test_publish_then_poll_returns_the_message_with_a_publisher_sequence_id(
        self, gcs: Gcs, channel: grpc.aio.Channel
    ) -> None:
        """GcsPublish's preset sequence id is replaced; the reply carries publisher_id."""
        stub = ServiceStub(channel, CONTROL_PLANE_PUBSUB, timeout_s=30)
        cmd = pubsub_pb2.Command(channel_type=GCS_NODE_INFO_CHANNEL)
        cmd.subscribe_message.SetInParent()
        await stub.GcsSubscriberCommandBatch(
            gcs_service_pb2.GcsSubscriberCommandBatchRequest(subscriber_id=b"s", commands=[cmd])
        )
        msg = pubsub_pb2.PubMessage(channel_type=GCS_NODE_INFO_CHANNEL, key_id=b"n", sequence_id=77)
        msg.node_info_message.CopyFrom(node("a"))
        await stub.GcsPublish(gcs_service_pb2.GcsPublishRequest(pub_messages=[msg]))
        reply = await stub.GcsSubscriberPoll(
            gcs_service_pb2.GcsSubscriberPollRequest(
                subscriber_id=b"s", publisher_id=NIL_PUBLISHER_ID
            )
        )
        assert reply.publisher_id == gcs.pubsub.control_plane.publisher_id
        assert [(m.sequence_id, m.node_info_message.node_name) for m in reply.pub_messages] == [
            (1, "a")
        ]

    async def test_subscribing_to_an_unhosted_channel_is_aborted_invalid_argument(
        self, channel: grpc.aio.Channel
    ) -> None:
        """RAY_LOG lives on the observability service, not the control plane."""
        stub = ServiceStub(channel, CONTROL_PLANE_PUBSUB, timeout_s=30)
        cmd = pubsub_pb2.Command(channel_type=RAY_LOG_CHANNEL)
        cmd.subscribe_message.SetInParent()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.GcsSubscriberCommandBatch(
                gcs_service_pb2.GcsSubscriberCommandBatchRequest(subscriber_id=b"s", commands=[cmd])
            )
        assert info.value.code() == grpc.StatusCode.ABORTED
        assert (info.value.details() or "").startswith("InvalidArgument")

    async def test_report_job_error_publishes_on_error_info_keyed_by_job_hex(
        self, gcs: Gcs, channel: grpc.aio.Channel
    ) -> None:
        """ReportJobError goes out on RAY_ERROR_INFO with key = job id hex."""
        got = Seen()
        sub = GcsSubscriber(
            channel, on_message=got.append, service=OBSERVABILITY_PUBSUB, config=FAST
        )
        async with sub:
            await sub.subscribe(RAY_ERROR_INFO_CHANNEL)
            stub = ServiceStub(channel, OBSERVABILITY_PUBSUB, timeout_s=30)
            await stub.ReportJobError(
                gcs_service_pb2.ReportJobErrorRequest(
                    job_error=gcs_pb2.ErrorTableData(job_id=b"\x01\0\0\0", type="t")
                )
            )
            await got.until(lambda: len(got) == 1)
        assert got[0].key_id == b"01000000"
        assert got[0].error_info_message.type == "t"


class TestSubscriberClient:
    async def test_client_receives_messages_in_order_for_its_subscriptions(
        self, gcs: Gcs, channel: grpc.aio.Channel
    ) -> None:
        """Key filter, all-keys, ordering and acking through the real services."""
        got = Seen()
        sub = GcsSubscriber(
            channel, on_message=lambda m: got.append((m.sequence_id, m.key_id)), config=FAST
        )
        polled = watch_polls(gcs.pubsub.control_plane)
        async with sub:
            await sub.subscribe(GCS_NODE_INFO_CHANNEL)
            await sub.subscribe(GCS_JOB_CHANNEL, b"j1")
            pub = gcs.pubsub.control_plane
            pub.publish(GCS_NODE_INFO_CHANNEL, b"n1", node("a"))
            pub.publish(GCS_JOB_CHANNEL, b"j2", gcs_pb2.JobTableData(job_id=b"j2"))
            pub.publish(GCS_JOB_CHANNEL, b"j1", gcs_pb2.JobTableData(job_id=b"j1"))
            pub.publish(GCS_NODE_INFO_CHANNEL, b"n2", node("b"))
            await got.until(lambda: len(got) == 3)
            await polled.until(lambda: pub.queued(sub.subscriber_id) == ())  # acked
        assert got == [(1, b"n1"), (3, b"j1"), (4, b"n2")]

    async def test_unsubscribe_stops_delivery(self, gcs: Gcs, channel: grpc.aio.Channel) -> None:
        """After unsubscribe the publisher queues nothing for the client."""
        got: list[pubsub_pb2.PubMessage] = []
        async with GcsSubscriber(channel, on_message=got.append, config=FAST) as sub:
            await sub.subscribe(GCS_NODE_INFO_CHANNEL)
            await sub.unsubscribe(GCS_NODE_INFO_CHANNEL)
            gcs.pubsub.control_plane.publish(GCS_NODE_INFO_CHANNEL, b"n", node("a"))
            assert gcs.pubsub.control_plane.queued(sub.subscriber_id) == ()
        assert got == []

    async def test_subscribe_to_unhosted_channel_raises_subscribe_error(
        self, channel: grpc.aio.Channel
    ) -> None:
        """The client surfaces the GCS's refusal instead of retrying forever."""
        async with GcsSubscriber(channel, on_message=lambda m: None, config=FAST) as sub:
            with pytest.raises(SubscribeError) as info:
                await sub.subscribe(RAY_LOG_CHANNEL)
        assert info.value.code == grpc.StatusCode.ABORTED
        assert sub.subscriptions == ()

    async def test_observability_log_published_by_grpc_reaches_the_client(
        self, gcs: Gcs, channel: grpc.aio.Channel
    ) -> None:
        """A log monitor's GcsPublish(RAY_LOG) on the observability service is delivered."""
        got = Seen()
        sub = GcsSubscriber(
            channel, on_message=got.append, service=OBSERVABILITY_PUBSUB, config=FAST
        )
        async with sub:
            await sub.subscribe(RAY_LOG_CHANNEL)
            msg = pubsub_pb2.PubMessage(channel_type=RAY_LOG_CHANNEL)
            msg.log_batch_message.CopyFrom(logging_pb2.LogBatch(lines=["hello"]))
            stub = ServiceStub(channel, OBSERVABILITY_PUBSUB, timeout_s=30)
            await stub.GcsPublish(gcs_service_pb2.GcsPublishRequest(pub_messages=[msg]))
            await got.until(lambda: len(got) == 1)
        assert list(got[0].log_batch_message.lines) == ["hello"]


class TestPublisherRestart:
    async def test_client_detects_a_new_publisher_resubscribes_and_calls_back(self) -> None:
        """Stop the GCS, start a new one on the same port: callback, then new messages."""
        first = Gcs()
        await first.start()
        port = first.port
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=FAST_RECONNECT_OPTIONS)
        got, restarts = Seen(), Seen()
        sub = GcsSubscriber(
            ch,
            on_message=lambda m: got.append((m.sequence_id, m.node_info_message.node_name)),
            on_publisher_restart=restarts.append,
            config=FAST,
        )
        second = Gcs()
        try:
            await sub.start()
            await sub.subscribe(GCS_NODE_INFO_CHANNEL)
            first.pubsub.control_plane.publish(GCS_NODE_INFO_CHANNEL, b"n", node("a"))
            await got.until(lambda: got == [(1, "a")])
            old_id = sub.publisher_id
            assert old_id == first.pubsub.control_plane.publisher_id

            await first.stop()
            await second.start(port)
            new_id = second.pubsub.control_plane.publisher_id
            await restarts.until(lambda: restarts == [new_id])
            # Resubscribed before the callback: a publish on the new GCS arrives with seq 1.
            assert second.pubsub.control_plane.subscriptions_of(sub.subscriber_id) == {
                (GCS_NODE_INFO_CHANNEL, b"")
            }
            second.pubsub.control_plane.publish(GCS_NODE_INFO_CHANNEL, b"n", node("b"))
            await got.until(lambda: len(got) == 2)
            assert got == [(1, "a"), (1, "b")]
            assert sub.publisher_id == new_id != old_id
        finally:
            await sub.close()
            await sub.close()  # idempotent
            await ch.close()
            await second.stop()


class TestFairness:
    async def test_a_subscriber_that_never_polls_does_not_slow_others(
        self, gcs: Gcs, channel: grpc.aio.Channel
    ) -> None:
        """A silent subscriber's backlog grows; the active client still gets everything."""
        pub = gcs.pubsub.control_plane
        pub.subscribe(sub_id(99), GCS_NODE_INFO_CHANNEL)  # never polls
        pub.subscribe(sub_id(98), GCS_NODE_INFO_CHANNEL)
        stuck_poll = pub.poll(sub_id(98), 0, b"")  # held, then answered; never polls again
        got = Seen()
        async with GcsSubscriber(
            channel, on_message=lambda m: got.append(m.sequence_id), config=FAST
        ) as sub:
            await sub.subscribe(GCS_NODE_INFO_CHANNEL)
            for i in range(500):
                pub.publish(GCS_NODE_INFO_CHANNEL, b"n", node(str(i)))
                if i % 50 == 0:
                    await asyncio.sleep(0)  # let replies flow while publishing
            await got.until(lambda: len(got) == 500)
        assert got == list(range(1, 501))
        assert len(pub.queued(sub_id(99))) == 500
        assert len(pub.queued(sub_id(98))) == 500
        assert stuck_poll.done()


class TestLifecycle:
    async def test_start_and_stop_are_idempotent_and_stop_flushes_held_polls(self) -> None:
        """stop() before start, twice, and after start are all safe; held polls end empty."""
        pubsub = GcsPubSub.create(SystemClock(), sweep_interval_s=0.01)
        await pubsub.stop()
        await pubsub.start()
        await pubsub.start()
        assert pubsub.running
        held = pubsub.control_plane.poll(b"s", 0, pubsub.control_plane.publisher_id)
        await pubsub.stop()
        await pubsub.stop()
        assert not pubsub.running
        assert held.done() and held.result().messages == ()

    async def test_the_background_task_sweeps(self) -> None:
        """The task sweeps on its interval of the (fake) clock; an idle subscriber goes once
        the clock passes its timeout, and not before, however many sweeps ran."""
        import dataclasses

        from gcs.base.clock import FakeClock
        from gcs.managers.pubsub import PublisherConfig

        clock = FakeClock()
        cfg = dataclasses.replace(PublisherConfig.control_plane(), subscriber_timeout_ms=1000)
        pubsub = GcsPubSub.create(clock, control_plane=cfg, sweep_interval_s=0.01)
        sweeps = 0
        sweep = pubsub.sweep

        def counted() -> None:
            nonlocal sweeps
            sweeps += 1
            sweep()

        pubsub.sweep = counted  # type: ignore[method-assign]
        pubsub.control_plane.subscribe(b"s", GCS_NODE_INFO_CHANNEL)
        start_s = clock.monotonic_s()
        await pubsub.start()
        try:
            await clock.advance_until(lambda: sweeps >= 3, step_s=0.01)
            assert clock.monotonic_s() - start_s < 1.0
            assert pubsub.control_plane.has_subscriber(b"s")  # swept, not yet timed out
            await clock.advance_until(
                lambda: not pubsub.control_plane.has_subscriber(b"s"), step_s=0.01
            )
            assert clock.monotonic_s() - start_s >= 1.0
        finally:
            await pubsub.stop()


class TestClientRecovery:
    async def test_a_client_dropped_for_lagging_resubscribes_and_calls_back(self) -> None:
        """Past the safety cap the publisher drops it; the client recovers by itself."""
        import dataclasses

        from gcs.managers.pubsub import MailboxLimits, Overflow, PublisherConfig

        cfg = dataclasses.replace(
            PublisherConfig.control_plane(),
            limits=MailboxLimits(None, 3, Overflow.DROP_SUBSCRIBER),
        )
        g = Gcs()
        g.pubsub = GcsPubSub.create(SystemClock(), control_plane=cfg)
        await g.start()
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{g.port}", options=FAST_RECONNECT_OPTIONS)
        release = asyncio.Event()
        got, restarts = Seen(), Seen()

        async def slow(msg: pubsub_pb2.PubMessage) -> None:
            got.append(msg.node_info_message.node_name)
            await release.wait()

        sub = GcsSubscriber(ch, on_message=slow, on_publisher_restart=restarts.append, config=FAST)
        pub = g.pubsub.control_plane
        polled = watch_polls(pub)
        try:
            await sub.start()
            await sub.subscribe(GCS_NODE_INFO_CHANNEL)
            pub.publish(GCS_NODE_INFO_CHANNEL, b"n", node("first"))
            await got.until(lambda: got == ["first"])  # now stuck in the callback
            for i in range(4):
                pub.publish(GCS_NODE_INFO_CHANNEL, b"n", node(str(i)))
            assert not pub.has_subscriber(sub.subscriber_id)
            release.set()
            await restarts.until(lambda: restarts == [pub.publisher_id])
            await polled.until(lambda: pub.held_poll_count() == 1)
            pub.publish(GCS_NODE_INFO_CHANNEL, b"n", node("after"))
            await got.until(lambda: got[-1:] == ["after"])
        finally:
            await sub.close()
            await ch.close()
            await g.stop()

    async def test_unauthenticated_poll_is_fatal(self) -> None:
        """A wrong cluster id ends the loop and wait() raises it, as for Ray's clients."""
        from gcs.rpc import Unauthenticated, service_handler

        class Refuse:
            async def GcsSubscriberPoll(self, request, context):  # type: ignore[no-untyped-def]
                raise Unauthenticated("WrongClusterID")

        server = grpc.aio.server()
        server.add_generic_rpc_handlers([service_handler(CONTROL_PLANE_PUBSUB, Refuse())])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        sub = GcsSubscriber(ch, on_message=lambda m: None, config=FAST)
        try:
            await sub.start()
            async with asyncio.timeout(5):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await sub.wait()
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            await sub.close()
            await ch.close()
            await server.stop(grace=None)
