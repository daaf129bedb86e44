"""Thousands of concurrent long polls on one grpc.aio server (the publish fan-out burst)."""

from __future__ import annotations

import asyncio

import grpc

from gcs.base.clock import SystemClock
from gcs.managers.pubsub import GCS_NODE_INFO_CHANNEL
from gcs.proto import gcs_service_pb2
from gcs.rpc.server import LONG_POLL_SERVER_OPTIONS
from gcs.services.pubsub_runtime import GcsPubSub
from tests.pubsub.helpers import node, sub_id

POLL = "/ray.rpc.ControlPlanePubSubGcsService/GcsSubscriberPoll"
SUBSCRIBERS = 2000
CHANNELS = 20


class TestFanOutBurst:
    async def test_a_burst_of_2000_polls_is_held_and_answered_without_cancellations(
        self,
    ) -> None:
        """gRPC core's default cap of 1,000 unaccepted calls must not cancel re-polls."""
        pubsub = GcsPubSub.create(SystemClock())
        pub = pubsub.control_plane
        for i in range(SUBSCRIBERS):
            pub.subscribe(sub_id(i), GCS_NODE_INFO_CHANNEL)
        server = grpc.aio.server(options=list(LONG_POLL_SERVER_OPTIONS))
        server.add_generic_rpc_handlers(pubsub.handlers())
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channels = [
            grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
            )
            for _ in range(CHANNELS)
        ]
        try:
            await asyncio.gather(*(ch.channel_ready() for ch in channels))
            polls = [ch.unary_unary(POLL) for ch in channels]
            requests = [
                gcs_service_pb2.GcsSubscriberPollRequest(
                    subscriber_id=sub_id(i), publisher_id=pub.publisher_id
                ).SerializeToString()
                for i in range(SUBSCRIBERS)
            ]
            calls = [
                asyncio.ensure_future(polls[i % CHANNELS](req)) for i, req in enumerate(requests)
            ]
            async with asyncio.timeout(30):
                while pub.held_poll_count() < SUBSCRIBERS and not any(c.done() for c in calls):  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                assert pub.held_poll_count() == SUBSCRIBERS
                seq = pub.publish(GCS_NODE_INFO_CHANNEL, b"n" * 28, node("n"))
                replies = await asyncio.gather(*calls, return_exceptions=True)
            failed = [r for r in replies if not isinstance(r, bytes)]
            assert failed == []
            seqs = {
                tuple(
                    m.sequence_id
                    for m in gcs_service_pb2.GcsSubscriberPollReply.FromString(r).pub_messages
                )
                for r in replies
            }
            assert seqs == {(seq,)}
        finally:
            for ch in channels:
                await ch.close()
            await pubsub.stop()
            await server.stop(grace=None)
