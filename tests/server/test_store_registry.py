"""Stores come from one registry (``gcs.store.registry.STORES``): a new backend is its
module and one row.

The toy backend (``tests/store/toy_store.py``, registered with its one row for the test's
duration) is the whole of what adding one takes; the server then opens, uses and closes it
through the registry like any other, and ``gcs serve --storage toy://`` is accepted."""

from __future__ import annotations

import grpc
import pytest

from gcs.config import storage_scheme_ok
from gcs.proto import gcs_service_pb2 as Req
from gcs.server import GcsServer
from gcs.store import factory
from gcs.store.registry import STORES
from tests.conftest import Stubs, fast_config
from tests.store.toy_store import TOY, ToyStore


async def test_a_registered_backend_is_chosen_by_its_scheme_and_serves_the_gcs() -> None:
    assert not storage_scheme_ok("toy://x")
    with STORES.registered(TOY):  # the one row
        assert storage_scheme_ok("toy://x")
        server = GcsServer(fast_config(storage="toy://shelf"))
        await server.start()
    try:
        store = server.store
        assert isinstance(store, ToyStore) and store.opened and store.url == "toy://shelf"
        assert server.meta is not None
        async with grpc.aio.insecure_channel(server.address) as channel:
            kv = Stubs(channel, server.meta.cluster_id).kv
            await kv.InternalKVPut(Req.InternalKVPutRequest(namespace=b"n", key=b"k", value=b"v"))
            got = await kv.InternalKVGet(Req.InternalKVGetRequest(namespace=b"n", key=b"k"))
        assert got.value == b"v"
        assert store.writes > 0
    finally:
        await server.stop()
    assert store.closed


def test_an_unknown_scheme_names_the_ones_there_are() -> None:
    with pytest.raises(ValueError, match="unsupported scheme"):
        factory.store_from_url("toy://x")
