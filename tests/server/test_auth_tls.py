"""TLS with Ray's settings (``RAY_USE_TLS`` + ``RAY_TLS_*``): mutual TLS round trips between
our server, SDK and raylet agent, with a throwaway CA made by ``openssl`` in the test."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import grpc
import pytest

from gcs.base.clock import FakeClock
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc import ServiceStub
from gcs.rpc.descriptors import NODE_INFO
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import fast_config
from tests.pubsub.helpers import watch_polls

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

TOKEN = "tls-test-token"


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca_and_node_cert(where: pathlib.Path, name: str = "node") -> dict[str, str]:
    """A CA and a node certificate it signed (SAN 127.0.0.1/localhost; server+client use)."""
    where.mkdir(parents=True, exist_ok=True)
    if not (where / "ca.crt").exists():
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
            "-out", "ca.crt", "-days", "2", "-subj", "/CN=gcs-test-ca", cwd=where,
        )  # fmt: skip
    (where / f"{name}.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
        "-subj", f"/CN={name}", cwd=where,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=where,
    )  # fmt: skip
    return {
        "RAY_USE_TLS": "1",
        "RAY_TLS_SERVER_CERT": str(where / f"{name}.crt"),
        "RAY_TLS_SERVER_KEY": str(where / f"{name}.key"),
        "RAY_TLS_CA_CERT": str(where / "ca.crt"),
    }


@pytest.fixture
def pki(tmp_path, monkeypatch) -> dict[str, bytes]:
    """Ray's TLS + token environment set for this test; returns the CA and a certificate
    pair signed by a *different* CA (an intruder)."""
    env = make_ca_and_node_cert(tmp_path / "pki")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("HOME", str(tmp_path))
    other = make_ca_and_node_cert(tmp_path / "other-pki", "intruder")
    return {
        "ca": pathlib.Path(env["RAY_TLS_CA_CERT"]).read_bytes(),
        "intruder_key": pathlib.Path(other["RAY_TLS_SERVER_KEY"]).read_bytes(),
        "intruder_cert": pathlib.Path(other["RAY_TLS_SERVER_CERT"]).read_bytes(),
    }


async def test_tls_round_trip_sdk_agent_and_refusals(pki) -> None:
    from gcs.raylet.agent import RayletAgent, RayletConfig
    from gcs.sdk import get_cluster_status_async

    clock = FakeClock()
    server = GcsServer(fast_config(auth_mode="token"), store=MemoryStore(), clock=clock)
    await server.start()
    agent = RayletAgent(RayletConfig(gcs_address=server.address, resources={"CPU": 1.0}))
    try:
        assert server.security.describe() == {
            "auth": "token",
            "tls": "on",
            "token_source": "RAY_AUTH_TOKEN",
        }
        await get_cluster_status_async(address=server.address)  # SDK over mTLS + token
        await agent.start()  # registers over TLS; the GCS polls it over TLS (grpc transport)
        stats = server.managers.poller.stats
        await clock.advance_until(lambda: stats.polls_ok >= 2, step_s=0.1)
        assert stats.polls_failed == 0

        request = G.GetClusterIdRequest()
        async with grpc.aio.insecure_channel(server.address) as plain:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ServiceStub(plain, NODE_INFO, timeout_s=30).GetClusterId(request)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        # Ray's servers require a client certificate signed by the CA (mutual TLS).
        ca = pki["ca"]
        no_client_cert = grpc.ssl_channel_credentials(root_certificates=ca)
        async with grpc.aio.secure_channel(server.address, no_client_cert) as one_way:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ServiceStub(one_way, NODE_INFO, timeout_s=30).GetClusterId(request)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE

        foreign = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=pki["intruder_key"],
            certificate_chain=pki["intruder_cert"],
        )
        async with grpc.aio.secure_channel(server.address, foreign) as intruder:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ServiceStub(intruder, NODE_INFO, timeout_s=30).GetClusterId(request)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await agent.stop()
        await server.stop()


async def test_pubsub_served_by_the_front_server_over_mutual_tls(pki) -> None:
    """The long poll is answered by the front server itself (gcs.front), behind the same
    mutual TLS (ALPN h2) and token check as the relayed calls."""
    from gcs.managers.pubsub import GCS_NODE_INFO_CHANNEL
    from gcs.proto import gcs_pb2, pubsub_pb2
    from gcs.rpc.security import Security

    server = GcsServer(fast_config(auth_mode="token"), store=MemoryStore())
    await server.start()
    assert server.managers is not None
    polled = watch_polls(server.managers.pubsub.control_plane)
    try:
        assert server.config.front_server
        sub = b"t" * 28
        base = "/ray.rpc.ControlPlanePubSubGcsService/"
        cmd = pubsub_pb2.Command(channel_type=GCS_NODE_INFO_CHANNEL)
        cmd.subscribe_message.SetInParent()
        batch = G.GcsSubscriberCommandBatchRequest(subscriber_id=sub, commands=[cmd])
        poll = G.GcsSubscriberPollRequest(subscriber_id=sub)
        async with Security.from_env().aio_channel(server.address) as channel:
            await channel.unary_unary(base + "GcsSubscriberCommandBatch")(
                batch.SerializeToString(), timeout=10
            )
            held = channel.unary_unary(base + "GcsSubscriberPoll")(
                poll.SerializeToString(), timeout=10
            )
            publisher = server.managers.pubsub.control_plane
            await polled.until(lambda: publisher.held_poll_count() > 0)
            publisher.publish(GCS_NODE_INFO_CHANNEL, sub, gcs_pb2.GcsNodeInfo(node_id=sub))
            reply = G.GcsSubscriberPollReply.FromString(await held)
            assert len(reply.pub_messages) == 1
        ca = pki["ca"]
        no_client_cert = grpc.ssl_channel_credentials(root_certificates=ca)
        async with grpc.aio.secure_channel(server.address, no_client_cert) as one_way:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await one_way.unary_unary(base + "GcsSubscriberPoll")(
                    poll.SerializeToString(), timeout=3
                )
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop()
