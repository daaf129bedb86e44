"""What real Ray 2.60 processes need from ``gcs serve --head`` (issue 10, items 1-3).

The full python version in CLUSTER_METADATA, the virtual head, the syncer stream, jobs on
GCS_JOB, and the worker / task / runtime-env services -- each over the wire.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator

import grpc
import pytest

from gcs.base.clock import FakeClock
from gcs.managers.jobs import JobManager
from gcs.managers.runtime_env import RuntimeEnvPins
from gcs.managers.sync_hub import GCS_SYNCER_NODE_ID, RESOURCE_VIEW
from gcs.managers.workers import WorkerManager
from gcs.proto import common_pb2, gcs_pb2, pubsub_pb2, ray_syncer_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.server import GcsServer
from gcs.store.memory import MemoryStore
from tests.conftest import Stubs, fast_config

START_SYNC = "/ray.rpc.syncer.RaySyncer/StartSync"
HEAD = G.GetAllNodeInfoRequest.NodeSelector(is_head_node=True)


def _node(n: int) -> gcs_pb2.GcsNodeInfo:
    return gcs_pb2.GcsNodeInfo(
        node_id=bytes([n]) * 28,
        node_manager_address="127.0.0.1",
        node_manager_port=2000 + n,
        resources_total={"CPU": 2},
        state=gcs_pb2.GcsNodeInfo.ALIVE,
    )


@pytest.fixture
async def head_server() -> AsyncIterator[GcsServer]:
    server = GcsServer(
        fast_config(head=True, temp_dir="/tmp/ray-head-test", session_name="session_test"),
        store=MemoryStore(),
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def head_stubs(head_server: GcsServer) -> AsyncIterator[Stubs]:
    async with grpc.aio.insecure_channel(head_server.address) as channel:
        assert head_server.meta is not None
        yield Stubs(channel, head_server.meta.cluster_id)


class TestClusterMetadata:
    async def test_python_version_is_the_full_interpreter_version(self, stubs: Stubs) -> None:
        """Ray compares it to the patch level (``3.11`` made every worker refuse to start)."""
        reply = await stubs.kv.InternalKVGet(
            G.InternalKVGetRequest(namespace=b"cluster", key=b"CLUSTER_METADATA")
        )
        meta = json.loads(reply.value)
        assert meta["python_version"] == ".".join(map(str, sys.version_info[:3]))
        assert meta["ray_version"] == "2.60.0"

    async def test_a_configured_python_version_is_published_and_replaces_the_old(self) -> None:
        store = MemoryStore()
        for version in ("3.10.14", "3.12.1"):
            async with GcsServer(fast_config(python_version=version), store=store) as server:
                assert server.managers is not None
                raw = await server.managers.kv.get(b"cluster", b"CLUSTER_METADATA")
                assert raw is not None and json.loads(raw)["python_version"] == version


class TestVirtualHead:
    async def test_head_lookup_finds_the_virtual_head_with_its_directories(
        self, head_stubs: Stubs, head_server: GcsServer
    ) -> None:
        await head_stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=_node(1)))
        reply = await head_stubs.node_info.GetAllNodeInfo(
            G.GetAllNodeInfoRequest(node_selectors=[HEAD])
        )
        [head] = reply.node_info_list
        assert head.is_head_node and head.state == gcs_pb2.GcsNodeInfo.ALIVE
        assert head.temp_dir == "/tmp/ray-head-test"
        assert head.session_dir == "/tmp/ray-head-test/session_test"
        assert len(head.node_id) == 28
        # not a node of the table: a plain listing and DEAD lookups do not show it
        everything = await head_stubs.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest())
        assert [n.node_id for n in everything.node_info_list] == [_node(1).node_id]
        dead = await head_stubs.node_info.GetAllNodeInfo(
            G.GetAllNodeInfoRequest(node_selectors=[HEAD], state_filter=gcs_pb2.GcsNodeInfo.DEAD)
        )
        assert not dead.node_info_list
        assert head_server.managers is not None
        assert head.node_id not in head_server.managers.nodes.alive

    async def test_a_registered_head_raylet_wins(self, head_stubs: Stubs) -> None:
        real = _node(2)
        real.is_head_node = True
        await head_stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=real))
        reply = await head_stubs.node_info.GetAllNodeInfo(
            G.GetAllNodeInfoRequest(node_selectors=[HEAD])
        )
        assert [n.node_id for n in reply.node_info_list] == [real.node_id]

    async def test_without_head_there_is_no_head(self, stubs: Stubs) -> None:
        reply = await stubs.node_info.GetAllNodeInfo(G.GetAllNodeInfoRequest(node_selectors=[HEAD]))
        assert not reply.node_info_list


def _batch(node_id: bytes, version: int, **view: object) -> bytes:
    payload = ray_syncer_pb2.ResourceViewSyncMessage(**view).SerializeToString()  # type: ignore[arg-type]
    message = ray_syncer_pb2.RaySyncMessage(
        version=version, message_type=RESOURCE_VIEW, node_id=node_id, sync_message=payload
    )
    return ray_syncer_pb2.RaySyncMessageBatch(messages=[message]).SerializeToString()


class TestSyncerStream:
    async def test_views_cross_between_two_raylet_streams(
        self, gcs_server: GcsServer, stubs: Stubs
    ) -> None:
        a, b = _node(1), _node(2)
        for n in (a, b):
            await stubs.node_info.RegisterNode(G.RegisterNodeRequest(node_info=n))
        md = lambda n: (("node_id", n.node_id.hex()), ("ray_cluster_id", stubs.cluster_id.hex()))  # noqa: E731
        async with grpc.aio.insecure_channel(gcs_server.address) as channel:
            sync = channel.stream_stream(START_SYNC)
            a_out: asyncio.Queue[bytes] = asyncio.Queue()
            call_a = sync(_drain(a_out), metadata=md(a))
            call_b = sync(metadata=md(b))
            assert dict(await call_b.initial_metadata())["node_id"] == GCS_SYNCER_NODE_ID
            await a_out.put(_batch(a.node_id, 3, resources_available={"CPU": 1.0}))
            raw = await asyncio.wait_for(call_b.read(), timeout=10)
            [got] = ray_syncer_pb2.RaySyncMessageBatch.FromString(raw).messages
            assert (got.node_id, got.version) == (a.node_id, 3)
            assert gcs_server.managers is not None
            cache = gcs_server.managers.resources.nodes[a.node_id].data
            assert dict(cache.resources_available) == {"CPU": 1.0}
            call_a.cancel()
            call_b.cancel()

    async def test_a_stream_without_node_id_is_invalid_argument(
        self, gcs_server: GcsServer
    ) -> None:
        async with grpc.aio.insecure_channel(gcs_server.address) as channel:
            call = channel.stream_stream(START_SYNC)(metadata=())
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "node_id" in (info.value.details() or "")

    async def test_a_stream_of_another_cluster_is_unauthenticated(
        self, gcs_server: GcsServer
    ) -> None:
        """Ray's WrongClusterID rule holds for the stream too (a raylet of a previous
        non-persistent GCS must not feed this one)."""
        async with grpc.aio.insecure_channel(gcs_server.address) as channel:
            call = channel.stream_stream(START_SYNC)(
                metadata=(("node_id", "ab" * 28), ("ray_cluster_id", "cd" * 28))
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "WrongClusterID" in (info.value.details() or "")

    async def test_an_undecodable_batch_ends_the_stream_naming_the_type(
        self, gcs_server: GcsServer
    ) -> None:
        async with grpc.aio.insecure_channel(gcs_server.address) as channel:
            out: asyncio.Queue[bytes] = asyncio.Queue()
            call = channel.stream_stream(START_SYNC)(
                _drain(out), metadata=(("node_id", "ab" * 28),)
            )
            await out.put(b"\x0a\x64")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(call.read(), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "RaySyncMessageBatch" in (info.value.details() or "")


async def _drain(queue: asyncio.Queue[bytes]) -> AsyncIterator[bytes]:
    while True:
        yield await queue.get()


class TestJobsPublished:
    async def test_add_and_finish_publish_on_gcs_job(self) -> None:
        """Raylets start a job's workers only once GCS_JOB told them of the job."""
        seen: list[tuple[int, bytes, bool]] = []
        jobs = JobManager(
            MemoryStore(),
            FakeClock(),
            publish=lambda ch, key, msg: seen.append((ch, key, msg.is_dead)),
        )
        job_id = b"\x01\x00\x00\x00"
        await jobs.add(gcs_pb2.JobTableData(job_id=job_id))
        await jobs.mark_finished(job_id)
        assert seen == [
            (pubsub_pb2.GCS_JOB_CHANNEL, job_id, False),
            (pubsub_pb2.GCS_JOB_CHANNEL, job_id, True),
        ]


WORKER = b"\x07" * 28
NODE = b"\x08" * 28


def _worker(worker_id: bytes = WORKER, **kw: object) -> gcs_pb2.WorkerTableData:
    fields: dict[str, object] = {"is_alive": True, "pid": 42, **kw}
    return gcs_pb2.WorkerTableData(
        worker_address=common_pb2.Address(worker_id=worker_id, node_id=NODE),
        **fields,  # type: ignore[arg-type]
    )


class TestWorkers:
    async def test_add_report_failure_merges_and_publishes_the_delta(self) -> None:
        seen: list[tuple[int, bytes, object]] = []
        workers = WorkerManager(
            MemoryStore(), FakeClock(), publish=lambda ch, key, msg: seen.append((ch, key, msg))
        )
        await workers.add(_worker())
        await workers.report_failure(
            gcs_pb2.WorkerTableData(
                worker_address=common_pb2.Address(worker_id=WORKER, node_id=NODE),
                exit_type=common_pb2.INTENDED_USER_EXIT,
                exit_detail="bye",
            )
        )
        data = workers.get(WORKER)
        assert data is not None
        assert (data.is_alive, data.pid, data.exit_detail) == (False, 42, "bye")
        [(channel, key, delta)] = seen
        assert channel == pubsub_pb2.GCS_WORKER_DELTA_CHANNEL and key == WORKER
        assert delta == gcs_pb2.WorkerDeltaData(worker_id=WORKER, node_id=NODE)

    async def test_dead_workers_are_bounded_oldest_evicted_from_the_store(self) -> None:
        store = MemoryStore()
        workers = WorkerManager(store, FakeClock(), max_dead_cached=2)
        ids = [bytes([i]) * 28 for i in range(1, 5)]
        for worker_id in ids:
            await workers.add(_worker(worker_id))
            await workers.report_failure(_worker(worker_id, is_alive=False))
        assert list(workers.dead) == ids[2:]
        assert set(await store.get_all("WORKERS")) == set(ids[2:])

    async def test_service_filters_updates_and_errors(self, stubs: Stubs) -> None:
        w = stubs.workers
        await w.AddWorkerInfo(G.AddWorkerInfoRequest(worker_data=_worker()))
        await w.AddWorkerInfo(G.AddWorkerInfoRequest(worker_data=_worker(b"\x09" * 28)))
        await w.ReportWorkerFailure(
            G.ReportWorkerFailureRequest(worker_failure=_worker(b"\x09" * 28, is_alive=False))
        )
        await w.UpdateWorkerNumPausedThreads(
            G.UpdateWorkerNumPausedThreadsRequest(worker_id=WORKER, num_paused_threads_delta=2)
        )
        await w.UpdateWorkerDebuggerPort(
            G.UpdateWorkerDebuggerPortRequest(worker_id=WORKER, debugger_port=5678)
        )
        got = await w.GetWorkerInfo(G.GetWorkerInfoRequest(worker_id=WORKER))
        assert (got.worker_table_data.debugger_port, got.worker_table_data.num_paused_threads) == (
            5678,
            2,
        )
        alive = await w.GetAllWorkerInfo(
            G.GetAllWorkerInfoRequest(filters=G.GetAllWorkerInfoRequest.Filters(is_alive=True))
        )
        assert [x.worker_address.worker_id for x in alive.worker_table_data] == [WORKER]
        assert (alive.total, alive.num_filtered) == (2, 1)
        missing = await w.UpdateWorkerDebuggerPort(
            G.UpdateWorkerDebuggerPortRequest(worker_id=b"\x0a" * 28, debugger_port=1)
        )
        assert missing.status.code == 17  # Ray's NotFound, in the reply
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await w.AddWorkerInfo(G.AddWorkerInfoRequest(worker_data=_worker(b"\x01")))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "worker_data.worker_address.worker_id" in (info.value.details() or "")


class TestTasksOverTheWire:
    async def test_events_added_then_read_back(self, stubs: Stubs) -> None:
        """Listed once its task info arrived (Ray lists no attempt without it)."""
        events = gcs_pb2.TaskEvents(task_id=b"\x01" * 24, job_id=b"\x01\x00\x00\x00")
        events.state_updates.state_ts_ns[common_pb2.FINISHED] = 5
        data = gcs_pb2.TaskEventData(events_by_task=[events])
        await stubs.tasks.AddTaskEventData(G.AddTaskEventDataRequest(data=data))
        reply = await stubs.tasks.GetTaskEvents(G.GetTaskEventsRequest())
        assert reply.status.code == 0 and not reply.events_by_task
        assert reply.num_filtered_on_gcs == 1
        events.task_info.name = "f"
        data = gcs_pb2.TaskEventData(events_by_task=[events])
        await stubs.tasks.AddTaskEventData(G.AddTaskEventDataRequest(data=data))
        reply = await stubs.tasks.GetTaskEvents(G.GetTaskEventsRequest())
        assert [e.task_id for e in reply.events_by_task] == [b"\x01" * 24]


class TestRuntimeEnvPins:
    def test_an_expired_pin_frees_a_gcs_package_unless_a_live_job_uses_it(self) -> None:
        clock = FakeClock()
        job = gcs_pb2.JobTableData(job_id=b"\x01\x00\x00\x00")
        job.config.runtime_env_info.uris.working_dir_uri = "gcs://_ray_pkg_a.zip"
        jobs = [job]
        pins = RuntimeEnvPins(lambda: jobs, clock)
        pins.pin("gcs://_ray_pkg_a.zip", 10)
        pins.pin("gcs://_ray_pkg_b.zip", 10)
        pins.pin("s3://bucket/c.zip", 10)
        clock.advance(5)
        assert pins.expire() == []
        clock.advance(6)
        assert pins.expire() == ["gcs://_ray_pkg_b.zip"]  # a is held by the job, s3 not ours
        finished = gcs_pb2.JobTableData()
        finished.CopyFrom(job)
        finished.is_dead = True
        jobs[0] = finished
        pins.on_job_finished(finished)  # a job listener
        assert pins.expire() == ["gcs://_ray_pkg_a.zip"]

    def test_an_unpinned_package_goes_when_its_job_ends(self) -> None:
        """``RAY_RUNTIME_ENV_URI_PIN_EXPIRATION_S=0``: Ray's driver pins nothing, the job's
        reference is the only one; Ray's GCS deletes the package when the job ends (Ray's
        ``test_pin_runtime_env_uri[...-0]``), ours kept it for ever."""
        clock = FakeClock()
        job = gcs_pb2.JobTableData(job_id=b"\x01\x00\x00\x00")
        job.config.runtime_env_info.uris.working_dir_uri = "gcs://_ray_pkg_a.zip"
        job.config.runtime_env_info.uris.py_modules_uris.append("gcs://_ray_pkg_shared.zip")
        other = gcs_pb2.JobTableData(job_id=b"\x02\x00\x00\x00")
        other.config.runtime_env_info.uris.py_modules_uris.append("gcs://_ray_pkg_shared.zip")
        jobs = [job, other]
        pins = RuntimeEnvPins(lambda: jobs, clock)
        assert pins.expire() == []
        jobs[0] = finished = _finished(job)
        pins.on_job_finished(finished)
        assert pins.expire() == ["gcs://_ray_pkg_a.zip"]  # the shared one: other still runs

    def test_a_live_detached_actor_keeps_its_jobs_package_until_it_dies(self) -> None:
        clock = FakeClock()
        job = gcs_pb2.JobTableData(job_id=b"\x01\x00\x00\x00")
        job.config.runtime_env_info.uris.working_dir_uri = "gcs://_ray_pkg_a.zip"
        jobs = {job.job_id: job}
        detached = {job.job_id}
        pins = RuntimeEnvPins(
            jobs.values,
            clock,
            holds=lambda j: not j.is_dead or j.job_id in detached,
            job=jobs.get,
        )
        jobs[job.job_id] = finished = _finished(job)
        pins.on_job_finished(finished)
        assert pins.expire() == []  # its detached actor lives
        detached.clear()
        pins.on_job_released(job.job_id)
        assert pins.expire() == ["gcs://_ray_pkg_a.zip"]

    async def test_a_finished_jobs_package_is_deleted_from_kv(
        self, gcs_server: GcsServer, stubs: Stubs, gcs_clock: FakeClock
    ) -> None:
        uri = b"gcs://_ray_pkg_job.zip"
        await stubs.kv.InternalKVPut(G.InternalKVPutRequest(key=uri, value=b"zip", overwrite=True))
        job = gcs_pb2.JobTableData(job_id=b"\x05\x00\x00\x00", driver_pid=1)
        job.config.runtime_env_info.uris.working_dir_uri = uri.decode()
        await stubs.jobs.AddJob(G.AddJobRequest(data=job))
        gcs_clock.advance(30.0)
        got = await stubs.kv.InternalKVGet(G.InternalKVGetRequest(key=uri))
        assert got.value == b"zip"  # the running job holds it
        await stubs.jobs.MarkJobFinished(G.MarkJobFinishedRequest(job_id=job.job_id))

        async def gone() -> bool:
            got = await stubs.kv.InternalKVGet(G.InternalKVGetRequest(key=uri))
            return got.status.code == 17

        await gcs_clock.advance_until(gone, step_s=1.0)

    async def test_pinned_package_is_deleted_from_kv_after_expiry(
        self, gcs_server: GcsServer, stubs: Stubs, gcs_clock: FakeClock
    ) -> None:
        uri = b"gcs://_ray_pkg_test.zip"
        await stubs.kv.InternalKVPut(G.InternalKVPutRequest(key=uri, value=b"zip", overwrite=True))
        await stubs.runtime_env.PinRuntimeEnvURI(
            G.PinRuntimeEnvURIRequest(uri=uri.decode(), expiration_s=0)
        )

        async def gone() -> bool:
            got = await stubs.kv.InternalKVGet(G.InternalKVGetRequest(key=uri))
            return got.status.code == 17

        await gcs_clock.advance_until(gone, step_s=1.0)  # the expiry loop's period


def _finished(job: gcs_pb2.JobTableData) -> gcs_pb2.JobTableData:
    done = gcs_pb2.JobTableData()
    done.CopyFrom(job)
    done.is_dead = True
    return done
