"""The front server in ``gcs serve`` (gcs.front): same answers as the grpc.aio path for
bad input, held polls cancelled by the client, streams relayed to grpc.aio, metrics,
graceful stop and hostile bytes on the port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gcs.base.changes import Changes
from gcs.config import RequestLimits
from gcs.managers.pubsub import GCS_NODE_INFO_CHANNEL
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2, pubsub_pb2
from gcs.rpc import descriptors as svc
from gcs.rpc.h2_frames import GOAWAY
from gcs.rpc.method_paths import method_path
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import eventually, fast_config
from tests.pubsub.helpers import watch_polls

POLL = "/ray.rpc.ControlPlanePubSubGcsService/GcsSubscriberPoll"
COMMANDS = "/ray.rpc.ControlPlanePubSubGcsService/GcsSubscriberCommandBatch"
PUBLISH = "/ray.rpc.ControlPlanePubSubGcsService/GcsPublish"
OBS_POLL = "/ray.rpc.ObservabilityPubSubService/GcsSubscriberPoll"
CLUSTER_ID = "/ray.rpc.NodeInfoGcsService/GetClusterId"
TOKEN = "front-token-0123456789"


async def token_server(tmp_path: Path, monkeypatch: Any, *, front: bool) -> GcsServer:
    """A started GCS in token mode (``TOKEN``), requests bounded at 4 KiB."""
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_USE_TLS"):
        monkeypatch.delenv(var, raising=False)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    server = GcsServer(
        fast_config(
            front_server=front,
            auth_mode="token",
            auth_token_path=str(token),
            limits=RequestLimits(max_request_bytes=4096),
        ),
        store=MemoryStore(),
    )
    await server.start()
    return server


@pytest.fixture
async def pair(tmp_path, monkeypatch) -> AsyncIterator[tuple[GcsServer, GcsServer]]:
    """The same GCS twice in token mode: front server on, and grpc.aio alone."""
    servers = []
    for front in (True, False):
        servers.append(await token_server(tmp_path, monkeypatch, front=front))
    try:
        yield servers[0], servers[1]
    finally:
        for server in servers:
            await server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_pair(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[GcsServer, GcsServer]]:
    """:func:`pair`, started once for the every-method comparison (~60 tests: two servers
    started and stopped per method cost ~0.4 CPU s each).  Both servers get the same calls
    in the same order, so each method still meets the same state on both."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        servers = []
        for front in (True, False):
            tmp = tmp_path_factory.mktemp("pair")
            servers.append(await token_server(tmp, monkeypatch, front=front))
        try:
            yield servers[0], servers[1]
        finally:
            for server in servers:
                await server.stop()


def _auth(extra: tuple[tuple[str, str], ...] = ()) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKEN}"), *extra)


async def _answer(
    address: str,
    path: str,
    body: bytes,
    metadata: tuple[tuple[str, str], ...],
    compression: grpc.Compression | None = None,
    timeout: float = 10,
) -> tuple[grpc.StatusCode, str]:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(path)(
            body, metadata=metadata, timeout=timeout, compression=compression
        )
        try:
            await call
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or ""
        return grpc.StatusCode.OK, ""


def _subscribe(sub_id: bytes, channel: int) -> bytes:
    cmd = pubsub_pb2.Command(channel_type=channel)  # type: ignore[arg-type]
    cmd.subscribe_message.SetInParent()
    return gcs_service_pb2.GcsSubscriberCommandBatchRequest(
        subscriber_id=sub_id, commands=[cmd]
    ).SerializeToString()


BAD_INPUTS = {
    "undecodable poll": (POLL, b"\x0a\x64", True),
    "undecodable observability poll": (OBS_POLL, b"\x0a\x64", True),
    "long subscriber id": (
        POLL,
        gcs_service_pb2.GcsSubscriberPollRequest(subscriber_id=b"s" * 3000).SerializeToString(),
        True,
    ),
    "unhosted channel": (COMMANDS, _subscribe(b"s" * 28, 999), True),
    "command without a kind": (
        COMMANDS,
        gcs_service_pb2.GcsSubscriberCommandBatchRequest(
            subscriber_id=b"s" * 28, commands=[pubsub_pb2.Command(channel_type=5)]
        ).SerializeToString(),
        True,
    ),
    "publish above the request limit": (PUBLISH, b"\x0a\x00" * 4000, True),
    "no token": (POLL, b"", False),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
async def test_front_and_grpc_aio_answer_bad_input_alike(
    pair: tuple[GcsServer, GcsServer], case: str
) -> None:
    path, body, with_token = BAD_INPUTS[case]
    metadata = _auth() if with_token else ()
    front, plain = pair
    got_front = await _answer(front.address, path, body, metadata)
    got_plain = await _answer(plain.address, path, body, metadata)
    assert got_front == got_plain
    assert got_front[0] not in (grpc.StatusCode.OK, grpc.StatusCode.UNIMPLEMENTED)
    assert got_front[1]


@pytest.mark.parametrize("path", [COMMANDS, CLUSTER_ID])
@pytest.mark.parametrize("body", [b"\x0a\x64", _subscribe(b"z" * 28, GCS_NODE_INFO_CHANNEL)])
async def test_gzip_requests_alike(
    pair: tuple[GcsServer, GcsServer], body: bytes, path: str
) -> None:
    front, plain = pair
    gzip = grpc.Compression.Gzip
    got = await _answer(front.address, path, body, _auth(), gzip)
    assert got == await _answer(plain.address, path, body, _auth(), gzip)


async def test_wrong_cluster_id_alike_on_served_and_relayed_methods(
    pair: tuple[GcsServer, GcsServer],
) -> None:
    front, plain = pair
    wrong = _auth((("ray_cluster_id", "ab" * 28),))
    body = _subscribe(b"s" * 28, GCS_NODE_INFO_CHANNEL)
    for path in (COMMANDS, CLUSTER_ID):
        got = await _answer(front.address, path, body if path == COMMANDS else b"", wrong)
        assert got == await _answer(plain.address, path, b"" if path == CLUSTER_ID else body, wrong)
        assert got[0] == grpc.StatusCode.UNAUTHENTICATED and "WrongClusterID" in got[1]


async def test_a_cancelled_held_poll_leaves_nothing_held(
    pair: tuple[GcsServer, GcsServer],
) -> None:
    front, _ = pair
    assert front.managers is not None
    publisher = front.managers.pubsub.control_plane
    polled = watch_polls(publisher)
    sub = b"c" * 28
    async with grpc.aio.insecure_channel(front.address) as channel:
        await channel.unary_unary(COMMANDS)(
            _subscribe(sub, GCS_NODE_INFO_CHANNEL), metadata=_auth(), timeout=10
        )
        poll = gcs_service_pb2.GcsSubscriberPollRequest(subscriber_id=sub)
        call = channel.unary_unary(POLL)(poll.SerializeToString(), metadata=_auth())
        await polled.until(lambda: publisher.held_poll_count() > 0)
        call.cancel()
        await polled.until(lambda: not publisher.held_poll_count())
        # the subscriber still works: a publish reaches the next poll
        poll2 = channel.unary_unary(POLL)(poll.SerializeToString(), metadata=_auth(), timeout=10)
        await polled.until(lambda: publisher.held_poll_count() > 0)
        publisher.publish(GCS_NODE_INFO_CHANNEL, b"n" * 28, gcs_pb2.GcsNodeInfo(node_id=b"n" * 28))
        reply = gcs_service_pb2.GcsSubscriberPollReply.FromString(await poll2)
        assert len(reply.pub_messages) == 1


async def test_served_methods_are_counted_like_the_grpc_path(
    pair: tuple[GcsServer, GcsServer],
) -> None:
    front, _ = pair
    await _answer(front.address, POLL, b"\x0a\x64", _auth())
    await _answer(front.address, COMMANDS, _subscribe(b"m" * 28, GCS_NODE_INFO_CHANNEL), _auth())
    await _answer(front.address, CLUSTER_ID, b"", _auth())  # native methods too
    await _answer(front.address, CLUSTER_ID, b"\x0a\x64", _auth())
    samples = {
        (s.labels["method"], s.labels["code"]): s.value
        for family in front.metrics.registry.collect()
        if family.name == "gcs_rpc"
        for s in family.samples
        if s.name == "gcs_rpc_total"
    }
    assert samples[(POLL, "INVALID_ARGUMENT")] == 1
    assert samples[(COMMANDS, "OK")] == 1
    assert samples[(CLUSTER_ID, "OK")] == 1
    assert samples[(CLUSTER_ID, "INVALID_ARGUMENT")] == 1


async def test_streams_are_relayed_to_grpc_aio(pair: tuple[GcsServer, GcsServer]) -> None:
    front, _ = pair
    async with grpc.aio.insecure_channel(front.address) as channel:
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        replies = [
            r async for r in reflection.ServerReflectionInfo(iter([request]), metadata=_auth())
        ]
        names = {s.name for s in replies[0].list_services_response.service}
        assert "ray.rpc.ControlPlanePubSubGcsService" in names
        health = health_pb2_grpc.HealthStub(channel)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""))
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        # unary, with metadata and deadline relayed
        reply = await channel.unary_unary(CLUSTER_ID)(b"", metadata=_auth(), timeout=5)
        assert front.meta is not None
        assert (
            gcs_service_pb2.GetClusterIdReply.FromString(reply).cluster_id == front.meta.cluster_id
        )


async def test_stop_answers_held_polls(tmp_path) -> None:
    server = GcsServer(fast_config(), store=MemoryStore())
    await server.start()
    assert server.managers is not None
    polled = watch_polls(server.managers.pubsub.control_plane)
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            sub = b"g" * 28
            await channel.unary_unary(COMMANDS)(_subscribe(sub, GCS_NODE_INFO_CHANNEL), timeout=10)
            poll = gcs_service_pb2.GcsSubscriberPollRequest(subscriber_id=sub).SerializeToString()
            call = channel.unary_unary(POLL)(poll, timeout=30)
            assert server.managers is not None
            publisher = server.managers.pubsub.control_plane
            await polled.until(lambda: publisher.held_poll_count() > 0)
            await server.stop()
            reply = gcs_service_pb2.GcsSubscriberPollReply.FromString(await call)
            assert not reply.pub_messages  # answered empty, not reset
    finally:
        await server.stop()


async def test_garbage_on_the_port_is_refused_and_the_server_lives(gcs_server: GcsServer) -> None:
    host, port = gcs_server.address.rsplit(":", 1)
    for junk in (b"GET / HTTP/1.1\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 100):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(junk)
        await writer.drain()
        async with asyncio.timeout(10):
            data = await reader.read()  # the server closes the connection
        assert GOAWAY in _frame_types(data)
        writer.close()
    sock = socket.create_connection((host, int(port)))
    sock.close()
    reply = await _answer(gcs_server.address, CLUSTER_ID, b"", ())
    assert reply == (grpc.StatusCode.OK, "")


def _frame_types(data: bytes) -> list[int]:
    types, pos = [], 0
    while pos + 9 <= len(data):
        types.append(data[pos + 3])
        pos += 9 + int.from_bytes(data[pos : pos + 3])
    return types


async def test_a_held_poll_past_its_deadline_is_released(gcs_server: GcsServer) -> None:
    assert gcs_server.managers is not None
    publisher = gcs_server.managers.pubsub.control_plane
    polled = watch_polls(publisher)
    sub = b"d" * 28
    async with grpc.aio.insecure_channel(gcs_server.address) as channel:
        await channel.unary_unary(COMMANDS)(_subscribe(sub, GCS_NODE_INFO_CHANNEL), timeout=10)
        poll = gcs_service_pb2.GcsSubscriberPollRequest(subscriber_id=sub).SerializeToString()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary(POLL)(poll, timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await polled.until(lambda: not publisher.held_poll_count())


def _every_unary_method() -> list[str]:
    paths = [
        method_path(m)
        for d in svc.SERVED_BY_GCS
        for m in d.methods
        if not (m.client_streaming or m.server_streaming)
    ]
    return [*paths, "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/List"]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("path", _every_unary_method())
async def test_every_unary_method_answers_like_grpc_aio(
    shared_pair: tuple[GcsServer, GcsServer], path: str
) -> None:
    """(a) undecodable bytes, (b) a default request: the same status and message."""
    front, plain = shared_pair
    # A default poll is held until its deadline on both: a short one keeps the test short.
    timeout = 1.0 if path.endswith("/GcsSubscriberPoll") else 10.0
    for body in (b"\x0a\x64", b""):
        got_front = await _answer(front.address, path, body, _auth(), timeout=timeout)
        got_plain = await _answer(plain.address, path, body, _auth(), timeout=timeout)
        assert got_front == got_plain, (body, got_front, got_plain)
        assert got_front[1] != "Method not found!"  # a served path, not an unknown one


BIG_CHANNEL = [
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]


async def _kv(address: str, name: str, request: Any) -> bytes:
    async with grpc.aio.insecure_channel(address, options=BIG_CHANNEL) as channel:
        path = method_path(svc.INTERNAL_KV.methods_by_name[name])
        return bytes(
            await channel.unary_unary(path)(
                request.SerializeToString(), metadata=_auth(), timeout=60
            )
        )


async def test_a_reply_above_16_mib_is_identical(pair: tuple[GcsServer, GcsServer]) -> None:
    keys = [b"big%d" % i for i in range(5)]
    replies = []
    for server in pair:
        for key in keys:
            value = key * ((4 << 20) // len(key))
            await _kv(
                server.address,
                "InternalKVPut",
                gcs_service_pb2.InternalKVPutRequest(
                    namespace=b"n", key=key, value=value, overwrite=True
                ),
            )
        replies.append(
            await _kv(
                server.address,
                "InternalKVMultiGet",
                gcs_service_pb2.InternalKVMultiGetRequest(namespace=b"n", keys=keys),
            )
        )
    assert len(replies[0]) > 16 << 20
    assert replies[0] == replies[1]


async def test_message_size_limits_alike(tmp_path, monkeypatch) -> None:
    """Requests and replies above ``grpc_max_message_bytes`` get grpc.aio's answer."""
    for var in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "RAY_USE_TLS"):
        monkeypatch.delenv(var, raising=False)
    answers = []
    for front in (True, False):
        async with (
            GcsServer(
                fast_config(front_server=front, grpc_max_message_bytes=1 << 20),
                store=MemoryStore(),
            ) as server,
            grpc.aio.insecure_channel(server.address, options=BIG_CHANNEL) as channel,
        ):
            put = channel.unary_unary(method_path(svc.INTERNAL_KV.methods_by_name["InternalKVPut"]))
            get = channel.unary_unary(
                method_path(svc.INTERNAL_KV.methods_by_name["InternalKVMultiGet"])
            )
            got = []
            for key in (b"a", b"b"):
                request = gcs_service_pb2.InternalKVPutRequest(
                    namespace=b"n", key=key, value=b"v" * 600_000
                )
                await put(request.SerializeToString(), timeout=30)
            too_big = gcs_service_pb2.InternalKVPutRequest(
                namespace=b"n", key=b"c", value=b"v" * (2 << 20)
            )
            both = gcs_service_pb2.InternalKVMultiGetRequest(namespace=b"n", keys=[b"a", b"b"])
            publish = channel.unary_unary(PUBLISH)  # a hot method: the same bound
            big_publish = gcs_service_pb2.GcsPublishRequest(
                pub_messages=[pubsub_pb2.PubMessage(key_id=b"k" * (2 << 20))]
            )
            for call, body in ((put, too_big), (get, both), (publish, big_publish)):
                try:
                    await call(body.SerializeToString(), timeout=30)
                    got.append(("OK", ""))
                except grpc.aio.AioRpcError as err:
                    got.append((err.code().name, err.details()))
            answers.append(got)
    assert answers[0] == answers[1], answers
    assert all(code == "RESOURCE_EXHAUSTED" for code, _ in answers[0]), answers


async def test_many_concurrent_calls_on_one_connection(pair: tuple[GcsServer, GcsServer]) -> None:
    front, _ = pair
    put_path = method_path(svc.INTERNAL_KV.methods_by_name["InternalKVPut"])
    get_path = method_path(svc.INTERNAL_KV.methods_by_name["InternalKVGet"])
    n = 500
    async with grpc.aio.insecure_channel(front.address) as channel:
        put, get = channel.unary_unary(put_path), channel.unary_unary(get_path)

        async def one(i: int) -> bytes:
            key = b"k%d" % i
            request = gcs_service_pb2.InternalKVPutRequest(namespace=b"c", key=key, value=key * 3)
            await put(request.SerializeToString(), metadata=_auth(), timeout=60)
            reply = await get(
                gcs_service_pb2.InternalKVGetRequest(namespace=b"c", key=key).SerializeToString(),
                metadata=_auth(),
                timeout=60,
            )
            return bytes(gcs_service_pb2.InternalKVGetReply.FromString(reply).value)

        values = await asyncio.gather(*(one(i) for i in range(n)))
        assert front.wiring is not None and front.wiring.rpc.front is not None
        assert len(front.wiring.rpc.front.connections) == 1
    assert values == [b"k%d" % i * 3 for i in range(n)]


async def test_a_held_unary_method_is_answered_and_past_its_deadline_cancelled(
    pair: tuple[GcsServer, GcsServer],
) -> None:
    """WaitPlacementGroupUntilReady is held until the group is created or removed: served
    natively, a removal answers the held call, and the caller's deadline cancels it on the
    server (counted CANCELLED by the handler's wrapper)."""
    front, _ = pair
    pgs = svc.PLACEMENT_GROUP_INFO.methods_by_name
    pg_id = b"p" * 18
    spec = common_pb2.PlacementGroupSpec(placement_group_id=pg_id, name="held")
    spec.bundles.add().unit_resources["CPU"] = 1.0
    wait_body = gcs_service_pb2.WaitPlacementGroupUntilReadyRequest(
        placement_group_id=pg_id
    ).SerializeToString()
    async with grpc.aio.insecure_channel(front.address) as channel:
        create = channel.unary_unary(method_path(pgs["CreatePlacementGroup"]))
        wait = channel.unary_unary(method_path(pgs["WaitPlacementGroupUntilReady"]))
        remove = channel.unary_unary(method_path(pgs["RemovePlacementGroup"]))
        request = gcs_service_pb2.CreatePlacementGroupRequest(placement_group_spec=spec)
        await create(request.SerializeToString(), metadata=_auth(), timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await wait(wait_body, metadata=_auth(), timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert front.managers is not None
        manager = front.managers.placement_groups
        entered, wait_ready = Changes(), manager.wait_ready

        async def told(group: bytes) -> None:
            entered.notify()
            await wait_ready(group)

        manager.wait_ready = told  # type: ignore[method-assign]
        held = wait(wait_body, metadata=_auth(), timeout=30)
        await entered.until(lambda: pg_id in manager._waiters)  # held on the server
        removal = gcs_service_pb2.RemovePlacementGroupRequest(placement_group_id=pg_id)
        await remove(removal.SerializeToString(), metadata=_auth(), timeout=10)
        reply = gcs_service_pb2.WaitPlacementGroupUntilReadyReply.FromString(await held)
        assert reply.status.code != 0  # removed: NotFound in the reply status
    wait_path = method_path(pgs["WaitPlacementGroupUntilReady"])

    def cancelled() -> float:
        return sum(
            s.value
            for family in front.metrics.registry.collect()
            if family.name == "gcs_rpc"
            for s in family.samples
            if s.name == "gcs_rpc_total"
            and s.labels["method"] == wait_path
            and s.labels["code"] == "CANCELLED"
        )

    # wall clock: grpc.aio reports the client's cancellation to the handler on its own time
    await eventually(lambda: cancelled() == 1, 10.0)
