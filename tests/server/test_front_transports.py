"""One GCS, both transports: every method the front server answers natively (the pubsub
methods, every unary method, ``StartSync``) gives the same reply or the same error through
the front server on the port and through grpc.aio on its private socket behind it -- the
same handler objects, adapted twice, never written twice."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from gcs.managers.sync_hub import GCS_SYNCER_NODE_ID
from gcs.proto import ray_syncer_pb2
from gcs.rpc import descriptors as svc
from gcs.rpc.method_paths import method_path
from gcs.server import GcsServer
from gcs.services.ray_syncer import START_SYNC_PATH
from tests.server.test_front_server import TOKEN, token_server

AUTH = (("authorization", f"Bearer {TOKEN}"),)
Answer = tuple[grpc.StatusCode, str, bytes]
PER_CALL_STATE = {
    "/ray.rpc.JobInfoGcsService/GetNextJobID": "each call takes the next job id",
    "/ray.rpc.autoscaler.AutoscalerStateService/GetClusterResourceState": "a version per read",
    "/ray.rpc.autoscaler.AutoscalerStateService/GetClusterStatus": "a version per read",
}
"""Methods whose OK reply differs from one call to the next by design: the status and the
details must match; the reply bytes may not."""


@pytest.fixture
async def server(tmp_path, monkeypatch) -> AsyncIterator[GcsServer]:
    gcs = await token_server(tmp_path, monkeypatch, front=True)
    try:
        yield gcs
    finally:
        await gcs.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[GcsServer]:
    """:func:`server`, started once for the every-method comparison (~60 tests: a server
    started and stopped per method cost ~0.25 CPU s each).  Each test compares the two
    transports' answers from the same state, one call after the other, as before."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        gcs = await token_server(tmp_path_factory.mktemp("gcs"), monkeypatch, front=True)
        try:
            yield gcs
        finally:
            await gcs.stop()


def _addresses(server: GcsServer) -> tuple[str, str]:
    assert server.wiring is not None
    internal = server.wiring.rpc.internal_address
    assert internal is not None
    return server.address, internal


def _native_unary_methods() -> list[str]:
    paths = [
        method_path(m)
        for d in svc.SERVED_BY_GCS
        for m in d.methods
        if not (m.client_streaming or m.server_streaming)
    ]
    return [*paths, "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/List"]


async def _unary(address: str, path: str, body: bytes, timeout: float) -> Answer:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await channel.unary_unary(path)(body, metadata=AUTH, timeout=timeout)
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or "", b""
        return grpc.StatusCode.OK, "", bytes(reply)


class TestEveryNativeMethodThroughBothTransports:
    @pytest.mark.asyncio(loop_scope="module")
    @pytest.mark.parametrize("path", _native_unary_methods())
    async def test_the_same_reply_or_error(self, shared_server: GcsServer, path: str) -> None:
        """Undecodable bytes and a default request: the same status, details and reply
        bytes from the front server and from grpc.aio (the same server's state)."""
        front, aio = _addresses(shared_server)
        # a default poll is held until its deadline on both: a short one keeps this short
        timeout = 1.0 if path.endswith("/GcsSubscriberPoll") else 10.0
        for body in (b"\x0a\x64", b""):
            got_front = await _unary(front, path, body, timeout)
            got_aio = await _unary(aio, path, body, timeout)
            if path in PER_CALL_STATE and got_front[0] == grpc.StatusCode.OK:
                got_front, got_aio = got_front[:2], got_aio[:2]
            assert got_front == got_aio, (body, got_front, got_aio)
            assert got_front[1] != "Method not found!"  # served, not unknown

    @pytest.mark.parametrize(
        ("case", "metadata"),
        [
            ("no node id", ()),
            ("not hex", (("node_id", "zz"),)),
            ("short", (("node_id", "ab" * 3),)),
            ("a raylet", (("node_id", "ab" * 28),)),
        ],
    )
    async def test_start_sync_alike(
        self, server: GcsServer, case: str, metadata: tuple[tuple[str, str], ...]
    ) -> None:
        """StartSync: the same refusal naming the field, or the same initial metadata and
        an OK end once the raylet stops writing."""
        answers = []
        for address in _addresses(server):
            async with grpc.aio.insecure_channel(address) as channel:
                call = channel.stream_stream(START_SYNC_PATH)(
                    metadata=(*AUTH, *metadata), timeout=10
                )
                try:
                    initial = dict(await call.initial_metadata()).get("node_id")
                    await call.done_writing()  # the raylet is done: the stream ends OK
                    replies = [bytes(r) async for r in call]
                    answers.append((grpc.StatusCode.OK, "", initial, replies))
                except grpc.aio.AioRpcError as err:
                    answers.append((err.code(), err.details() or "", None, []))
        assert answers[0] == answers[1], (case, answers)
        if case == "a raylet":
            assert answers[0][2] == GCS_SYNCER_NODE_ID

    async def test_a_bad_batch_ends_start_sync_alike(self, server: GcsServer) -> None:
        """A batch naming a 3-byte node: INVALID_ARGUMENT naming the field, on both."""
        bad = ray_syncer_pb2.RaySyncMessageBatch(
            messages=[ray_syncer_pb2.RaySyncMessage(node_id=b"\x01" * 3, version=1)]
        ).SerializeToString()
        answers = []
        for address in _addresses(server):
            async with grpc.aio.insecure_channel(address) as channel:
                call = channel.stream_stream(START_SYNC_PATH)(
                    iter([bad]), metadata=(*AUTH, ("node_id", "cd" * 28)), timeout=10
                )
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for _ in call:
                        pass
                answers.append((info.value.code(), info.value.details()))
        assert answers[0] == answers[1]
        assert answers[0][0] == grpc.StatusCode.INVALID_ARGUMENT
        assert "messages[0].node_id has 3 bytes" in (answers[0][1] or "")
