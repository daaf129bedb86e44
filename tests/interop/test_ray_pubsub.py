"""Ray 2.60's own C++ pubsub subscriber (``ray._raylet.GcsLogSubscriber``) against our GCS.

Its first poll carries the nil publisher id; we hold it as Ray's GCS does (no extra empty
reply per subscriber), and the published log batch reaches it as the shared one-message
reply bytes.
"""

from __future__ import annotations

import asyncio
import json
import textwrap

import pytest

from gcs.managers.pubsub import RAY_LOG_CHANNEL
from gcs.proto import gcs_service_pb2, logging_pb2, pubsub_pb2
from tests.interop import venvs

pytestmark = pytest.mark.interop

SCRIPT = textwrap.dedent(
    """
    import json, sys, grpc
    from ray._raylet import GcsLogSubscriber

    address, publish_hex, cluster_hex = sys.argv[1:4]
    sub = GcsLogSubscriber(address=address)
    sub.subscribe()
    channel = grpc.insecure_channel(address)
    channel.unary_unary("/ray.rpc.ObservabilityPubSubService/GcsPublish")(
        bytes.fromhex(publish_hex), metadata=(("ray_cluster_id", cluster_hex),), timeout=10)
    got = sub.poll(timeout=20)
    sub.close()
    print(json.dumps({"got": got}, default=str))
    """
)


class TestRaySubscriber:
    async def test_ray_log_subscriber_receives_a_published_batch(
        self, ray_venv, gcs_server
    ) -> None:
        batch = logging_pb2.LogBatch(ip="10.0.0.9", pid="4242", lines=["hello", "world"])
        msg = pubsub_pb2.PubMessage(channel_type=RAY_LOG_CHANNEL, key_id=b"")
        msg.log_batch_message.CopyFrom(batch)
        request = gcs_service_pb2.GcsPublishRequest(pub_messages=[msg]).SerializeToString()
        assert gcs_server.meta is not None
        script = (
            "import sys; sys.argv = ['x', "
            f"{gcs_server.address!r}, {request.hex()!r}, {gcs_server.meta.cluster_id_hex!r}]\n"
            + SCRIPT
        )
        out = await asyncio.to_thread(venvs.run_in_venv, ray_venv, script, timeout=120)
        got = out["got"]
        assert got["ip"] == "10.0.0.9" and got["lines"] == ["hello", "world"], json.dumps(got)
        assert gcs_server.managers is not None
        assert gcs_server.managers.pubsub.observability.last_sequence_id == 1
