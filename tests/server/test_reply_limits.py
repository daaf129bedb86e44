"""Replies that grow with stored data stop being built at the message limit (issue 18:
InternalKVKeys over 10,000 keys of 64 KiB built the whole 655 MB reply, 3.3 GiB at peak,
before answering RESOURCE_EXHAUSTED).  Scaled down: a 2 MiB message limit, 4 MiB of keys;
what the call allocates is measured with tracemalloc."""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from gcs.base.errors import ResourceExhausted
from gcs.config import RequestLimits
from gcs.managers.tasks import TaskEventStore
from gcs.proto import gcs_pb2, gcs_service_pb2, virtual_cluster_data_pb2, virtual_cluster_pb2
from gcs.rpc import descriptors as svc
from gcs.rpc.method_paths import method_path
from gcs.server import GcsServer
from gcs.services.common import ReplySize
from gcs.services.node_resources import NodeResourceInfoServicer
from gcs.services.virtual_clusters import VirtualClusterInfoServicer
from gcs.services.workers_tasks import TaskInfoServicer
from gcs.store import store_from_url
from gcs.store.memory import MemoryStore
from tests.conftest import fast_config

LIMIT = 2 << 20
KV = svc.INTERNAL_KV.methods_by_name
OPTIONS = [
    ("grpc.max_send_message_length", 16 << 20),
    ("grpc.max_receive_message_length", 16 << 20),
]


@pytest.fixture
async def server() -> AsyncIterator[GcsServer]:
    config = fast_config(grpc_max_message_bytes=LIMIT)
    async with GcsServer(config, store=MemoryStore()) as gcs:
        yield gcs


async def _put(channel: grpc.aio.Channel, key: bytes, value: bytes) -> None:
    put = channel.unary_unary(method_path(KV["InternalKVPut"]))
    request = gcs_service_pb2.InternalKVPutRequest(namespace=b"n", key=key, value=value)
    await put(request.SerializeToString(), timeout=60)


async def _peak_of_call(
    channel: grpc.aio.Channel, name: str, request: bytes
) -> tuple[grpc.StatusCode, str, int]:
    call = channel.unary_unary(method_path(KV[name]))
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        try:
            await call(request, timeout=60)
            code, details = grpc.StatusCode.OK, ""
        except grpc.aio.AioRpcError as err:
            code, details = err.code(), err.details() or ""
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return code, details, peak


async def test_kv_keys_stops_at_the_limit(server: GcsServer) -> None:
    async with grpc.aio.insecure_channel(server.address, options=OPTIONS) as channel:
        for i in range(64):  # 64 keys of 64 KiB: 4 MiB of names, twice the limit
            await _put(channel, b"%02d" % i + b"k" * (64 * 1024 - 2), b"v")
        request = gcs_service_pb2.InternalKVKeysRequest(namespace=b"n", prefix=b"")
        code, details, peak = await _peak_of_call(
            channel, "InternalKVKeys", request.SerializeToString()
        )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_reply_bytes" in details and str(LIMIT) in details, details
    assert peak < LIMIT, peak  # before: the keys copied, the reply, its encoding (> 12 MiB)


async def test_kv_multi_get_stops_at_the_limit(server: GcsServer) -> None:
    async with grpc.aio.insecure_channel(server.address, options=OPTIONS) as channel:
        keys = [b"a", b"b", b"c", b"d"]
        for key in keys:  # 4 x 900 KiB
            await _put(channel, key, key * (900 * 1024))
        request = gcs_service_pb2.InternalKVMultiGetRequest(namespace=b"n", keys=keys)
        code, details, peak = await _peak_of_call(
            channel, "InternalKVMultiGet", request.SerializeToString()
        )
        small = gcs_service_pb2.InternalKVMultiGetRequest(namespace=b"n", keys=[b"a", b"b"])
        reply = await channel.unary_unary(method_path(KV["InternalKVMultiGet"]))(
            small.SerializeToString(), timeout=60
        )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_reply_bytes" in details, details
    assert peak < 2 * LIMIT, peak
    got = gcs_service_pb2.InternalKVMultiGetReply.FromString(reply)
    assert [r.key for r in got.results] == [b"a", b"b"]


def test_reply_size_counts_entries_with_their_framing() -> None:
    size = ReplySize(1000, "things")
    for _ in range(9):
        size.add_bytes(100)  # 100 + tag + 1-byte length
    assert size.size == 9 * 103
    with pytest.raises(Exception, match=r"1000 bytes .* at 10 things"):
        size.add_bytes(100)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_scan_keys_reads_keys_and_stops_past_the_bound(kind: str, tmp_path: Any) -> None:
    url = "memory://" if kind == "memory" else f"sqlite+aiosqlite:///{tmp_path}/s.sqlite3"
    async with store_from_url(url) as store:
        await store.put_many("KV", {b"p/%d" % i: b"v" * 1000 for i in range(10)} | {b"q": b"x"})
        keys = await store.scan_keys("KV", b"p/", max_bytes=100)
        assert keys is not None and sorted(keys) == sorted(b"p/%d" % i for i in range(10))
        assert await store.scan_keys("KV", b"p/", max_bytes=29) is None  # 10 x 3 bytes
        assert await store.scan_keys("KV", b"none", max_bytes=0) == []


# -- the replies that had no bound: task events, resource usage, virtual clusters --------


def _task_events(n: int, payload: int) -> gcs_pb2.TaskEventData:
    data = gcs_pb2.TaskEventData(job_id=b"j")
    for i in range(n):
        events = data.events_by_task.add(task_id=b"t%03d" % i, job_id=b"j")
        events.task_info.name = "x" * payload
    return data


def test_task_events_past_the_byte_bound_are_counted_truncated_not_built() -> None:
    store = TaskEventStore()
    store.add(_task_events(10, 1000))  # ten entries of ~1 KiB
    request = gcs_service_pb2.GetTaskEventsRequest()
    reply = store.query(request, max_bytes=3500)
    assert len(reply.events_by_task) == 3 and reply.num_truncated == 7
    assert reply.ByteSize() < 3500 + 100
    whole = store.query(request)  # no bound: all of them
    assert len(whole.events_by_task) == 10 and whole.num_truncated == 0


async def test_get_task_events_is_bounded_by_max_reply_bytes() -> None:
    store = TaskEventStore()
    store.add(_task_events(10, 1000))
    servicer = TaskInfoServicer(store, limits=RequestLimits(max_reply_bytes=4096))
    wire = await servicer.GetTaskEvents(gcs_service_pb2.GetTaskEventsRequest(), None)
    reply = gcs_service_pb2.GetTaskEventsReply.FromString(wire)
    assert reply.HasField("status") and reply.status.code == 0
    assert 0 < len(reply.events_by_task) < 10
    assert len(reply.events_by_task) + reply.num_truncated == 10
    assert reply.ByteSize() <= 4096


async def test_get_all_resource_usage_stops_at_max_reply_bytes() -> None:
    usage = gcs_pb2.ResourcesData(node_id=b"n" * 28, resources_total={"CPU": 4.0})
    entries = {i: SimpleNamespace(data=usage) for i in range(100)}
    cache = SimpleNamespace(nodes=entries, demand={})
    pgs = SimpleNamespace(pending=list)
    limit = 20 * usage.ByteSize()
    servicer = NodeResourceInfoServicer(
        None,  # type: ignore[arg-type]
        cache,  # type: ignore[arg-type]
        pgs,  # type: ignore[arg-type]
        limits=RequestLimits(max_reply_bytes=limit),
    )
    with pytest.raises(ResourceExhausted, match=r"max_reply_bytes.*node resource usages"):
        await servicer.GetAllResourceUsage(gcs_service_pb2.GetAllResourceUsageRequest(), None)
    cache.nodes = dict(list(entries.items())[:10])
    reply = await servicer.GetAllResourceUsage(gcs_service_pb2.GetAllResourceUsageRequest(), None)
    assert len(reply.resource_usage_data.batch) == 10


async def test_virtual_cluster_lists_stop_at_max_reply_bytes() -> None:
    data = virtual_cluster_data_pb2.VirtualClusterTableData(id="vc", revision=1)
    for i in range(50):
        data.node_instances[f"{i:056x}"].hostname = "h" * 100
    registry = SimpleNamespace(get_virtual_clusters=lambda *_: [data] * 10)
    manager = SimpleNamespace(registry=registry)
    servicer = VirtualClusterInfoServicer(
        manager,  # type: ignore[arg-type]
        limits=RequestLimits(max_reply_bytes=3 * data.ByteSize()),
    )
    request = virtual_cluster_pb2.GetVirtualClustersRequest()
    with pytest.raises(ResourceExhausted, match=r"max_reply_bytes.*virtual clusters"):
        await servicer.GetVirtualClusters(request, None)
