"""The ``event_loop`` setting: ``gcs serve`` on the standard asyncio loop or on uvloop, and
the server (its front server and lean HTTP/2 client included) working on uvloop."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gcs.config import ConfigError, load_config
from gcs.proto import gcs_service_pb2 as G
from gcs.server import GcsServer
from gcs.server.event_loop import loop_factory
from gcs.store.memory import MemoryStore
from tests.conftest import Stubs, fast_config

uvloop = pytest.importorskip("uvloop")


def test_asyncio_is_the_standard_loop_and_uvloop_is_uvloops() -> None:
    assert loop_factory("asyncio") is None
    factory = loop_factory("uvloop")
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_an_unknown_loop_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GCS_EVENT_LOOP", "trio")
    with pytest.raises(ConfigError, match=r"event_loop.*GCS_EVENT_LOOP.*'trio'"):
        load_config(flags={})
    monkeypatch.setenv("GCS_EVENT_LOOP", "uvloop")
    assert load_config(flags={}).event_loop == "uvloop"


async def _serve_and_call() -> tuple[bytes, int]:
    server = GcsServer(fast_config(), store=MemoryStore())
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stubs = Stubs(channel, server.meta.cluster_id)
            cluster_id = (await stubs.node_info.GetClusterId(G.GetClusterIdRequest())).cluster_id
            put = G.InternalKVPutRequest(namespace=b"n", key=b"k", value=b"v", overwrite=True)
            await stubs.kv.InternalKVPut(put)
            got = await stubs.kv.InternalKVGet(G.InternalKVGetRequest(namespace=b"n", key=b"k"))
            assert got.value == b"v"
            reply = await stubs.tasks.GetTaskEvents(G.GetTaskEventsRequest())
            return cluster_id, reply.status.code
    finally:
        await server.stop()


def test_the_server_answers_on_uvloop() -> None:
    """Its front server takes uvloop's transports (not asyncio.Transport subclasses)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        cluster_id, code = runner.run(_serve_and_call())
    assert len(cluster_id) == 28 and code == 0
