"""Ray 2.60's answers over the wire: GetAllJobInfo's job-API and running-task fields,
GetTaskEvents' order and loss counts, and Ray-style error statuses (issue 27, item 5).

What each expects was measured on Ray 2.60's own gcs_server (the probe in
``docs/ray-answers.md``), not inferred."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import pytest

from gcs.proto import autoscaler_pb2 as A
from gcs.proto import common_pb2, core_worker_pb2, gcs_pb2
from gcs.proto import gcs_service_pb2 as G
from gcs.rpc.descriptors import CORE_WORKER
from gcs.rpc.errors import RAY_STATUS_DETAILS_KEY, ray_message
from gcs.rpc.method_paths import method_path

F = G.GetTaskEventsRequest.Filters
INVALID, INVALID_ARGUMENT = 4, 34
J1 = b"\x01\x00\x00\x00"


class FakeDriver:
    """A driver's core worker that answers NumPendingTasks with ``pending``."""

    def __init__(self, pending: int) -> None:
        self.pending = pending
        self.calls = 0
        self.port = 0

    def handler(self) -> grpc.GenericRpcHandler:
        async def num_pending(request: bytes, context: object) -> bytes:
            self.calls += 1
            return core_worker_pb2.NumPendingTasksReply(
                num_pending_tasks=self.pending
            ).SerializeToString()

        path = method_path(CORE_WORKER.methods_by_name["NumPendingTasks"])
        return grpc.method_handlers_generic_handler(
            path.split("/")[1],
            {path.split("/")[2]: grpc.unary_unary_rpc_method_handler(num_pending)},
        )


@pytest.fixture
async def driver() -> AsyncIterator[FakeDriver]:
    fake = FakeDriver(pending=2)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((fake.handler(),))
    fake.port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield fake
    finally:
        await server.stop(None)


def job(n: int, *, submission_id: str | None = None, port: int = 1) -> gcs_pb2.JobTableData:
    data = gcs_pb2.JobTableData(
        job_id=n.to_bytes(4, "little"),
        driver_address=common_pb2.Address(ip_address="127.0.0.1", port=port, worker_id=b"w" * 28),
    )
    if submission_id is not None:
        data.config.metadata["job_submission_id"] = submission_id
    return data


def job_api_json(submission_id: str, status: str) -> bytes:
    """What Ray 2.60's job manager writes (``JobInfo.to_json``), nulls included."""
    return json.dumps(
        {
            "status": status,
            "entrypoint": "python x.py",
            "message": "Job is currently running.",
            "error_type": None,
            "start_time": 1700000000000,
            "end_time": None,
            "metadata": {"owner": "me"},
            "entrypoint_num_cpus": None,
            "entrypoint_num_gpus": None,
            "entrypoint_memory": None,
            "entrypoint_resources": None,
            "driver_agent_http_address": "http://127.0.0.1:52365",
            "driver_node_id": "ab" * 28,
            "driver_exit_code": None,
            "runtime_env_json": "{}",
        }
    ).encode()


class TestGetAllJobInfo:
    async def test_a_submitted_job_is_found_by_its_submission_id_with_the_job_api_record(
        self, stubs, driver
    ) -> None:
        """``ray job status <submission id>`` asks by submission id: the driver's record
        comes back, with the job API's own record in ``job_info`` (Ray's GcsJobManager)."""
        await stubs.jobs.AddJob(
            G.AddJobRequest(data=job(1, submission_id="raysubmit_A", port=driver.port))
        )
        await stubs.jobs.AddJob(G.AddJobRequest(data=job(2, port=driver.port)))
        await stubs.kv.InternalKVPut(
            G.InternalKVPutRequest(
                namespace=b"job",
                key=b"_ray_internal_job_info_raysubmit_A",
                value=job_api_json("raysubmit_A", "RUNNING"),
                overwrite=True,
            )
        )
        reply = await stubs.jobs.GetAllJobInfo(
            G.GetAllJobInfoRequest(job_or_submission_id="raysubmit_A")
        )
        [found] = reply.job_info_list
        assert found.job_id == (1).to_bytes(4, "little")
        assert found.HasField("job_info") and found.job_info.status == "RUNNING"
        assert found.job_info.driver_exit_code == 0 and not found.job_info.HasField(
            "driver_exit_code"
        )
        assert found.job_info.metadata["owner"] == "me"
        assert found.is_running_tasks  # the driver reports 2 pending tasks
        by_hex = await stubs.jobs.GetAllJobInfo(
            G.GetAllJobInfoRequest(job_or_submission_id=(2).to_bytes(4, "little").hex())
        )
        assert [j.job_id for j in by_hex.job_info_list] == [(2).to_bytes(4, "little")]
        assert not by_hex.job_info_list[0].HasField("job_info")  # not submitted

    async def test_skip_flags_leave_both_fields_unset_and_ask_no_driver(
        self, stubs, driver
    ) -> None:
        await stubs.jobs.AddJob(G.AddJobRequest(data=job(1, submission_id="s", port=driver.port)))
        await stubs.kv.InternalKVPut(
            G.InternalKVPutRequest(
                namespace=b"job",
                key=b"_ray_internal_job_info_s",
                value=job_api_json("s", "RUNNING"),
            )
        )
        reply = await stubs.jobs.GetAllJobInfo(
            G.GetAllJobInfoRequest(
                skip_submission_job_info_field=True, skip_is_running_tasks_field=True
            )
        )
        [found] = reply.job_info_list
        assert not found.HasField("job_info") and not found.HasField("is_running_tasks")
        assert driver.calls == 0

    async def test_is_running_tasks_follows_the_driver_and_is_false_once_finished(
        self, stubs, driver
    ) -> None:
        await stubs.jobs.AddJob(G.AddJobRequest(data=job(1, port=driver.port)))
        driver.pending = 0
        [idle] = (await stubs.jobs.GetAllJobInfo(G.GetAllJobInfoRequest())).job_info_list
        assert idle.HasField("is_running_tasks") and not idle.is_running_tasks
        await stubs.jobs.MarkJobFinished(G.MarkJobFinishedRequest(job_id=(1).to_bytes(4, "little")))
        calls = driver.calls
        [dead] = (await stubs.jobs.GetAllJobInfo(G.GetAllJobInfoRequest())).job_info_list
        assert dead.HasField("is_running_tasks") and not dead.is_running_tasks
        assert driver.calls == calls  # a finished job's driver is not asked

    async def test_a_driver_that_does_not_answer_leaves_the_field_unset(self, stubs) -> None:
        from gcs.testing.ports import free_port

        await stubs.jobs.AddJob(G.AddJobRequest(data=job(1, port=free_port())))
        [found] = (await stubs.jobs.GetAllJobInfo(G.GetAllJobInfoRequest())).job_info_list
        assert not found.HasField("is_running_tasks")

    async def test_limit_counts_kept_jobs_and_a_negative_one_is_rays_invalid_limit(
        self, stubs
    ) -> None:
        for n in (1, 2, 3):
            await stubs.jobs.AddJob(G.AddJobRequest(data=job(n)))
        skip = {"skip_submission_job_info_field": True, "skip_is_running_tasks_field": True}
        two = await stubs.jobs.GetAllJobInfo(G.GetAllJobInfoRequest(limit=2, **skip))
        assert len(two.job_info_list) == 2
        none = await stubs.jobs.GetAllJobInfo(G.GetAllJobInfoRequest(limit=0, **skip))
        assert len(none.job_info_list) == 0
        bad = await stubs.jobs.GetAllJobInfo(G.GetAllJobInfoRequest(limit=-1))
        assert (bad.status.code, bad.status.message) == (INVALID, "Invalid limit")


def task(n: int, *, attempt: int = 0, states: dict[int, int], kind: int = common_pb2.NORMAL_TASK):
    events = gcs_pb2.TaskEvents(
        task_id=n.to_bytes(24, "little"),
        attempt_number=attempt,
        job_id=J1,
        task_info=common_pb2.TaskInfoEntry(type=kind, name=f"t{n}", job_id=J1),
    )
    for state, ts in states.items():
        events.state_updates.state_ts_ns[state] = ts
    return events


async def add(stubs, *events: gcs_pb2.TaskEvents) -> None:
    data = gcs_pb2.TaskEventData(events_by_task=events, job_id=J1)
    await stubs.tasks.AddTaskEventData(G.AddTaskEventDataRequest(data=data))


def ids(reply: G.GetTaskEventsReply) -> list[tuple[int, int]]:
    return [(int.from_bytes(e.task_id, "little"), e.attempt_number) for e in reply.events_by_task]


RUN, DONE = common_pb2.RUNNING, common_pb2.FINISHED


class TestGetTaskEvents:
    async def test_a_limit_keeps_the_newest_and_counts_the_rest_as_dropped(self, stubs) -> None:
        """Ray walks finished attempts, then actor tasks, then the rest, newest first; what
        the limit cuts is truncated and counted in num_status_task_events_dropped, so the
        state API says the list is incomplete."""
        for n in range(1, 6):
            await add(stubs, task(n, states={DONE: n}))
        reply = await stubs.tasks.GetTaskEvents(G.GetTaskEventsRequest(limit=2))
        assert ids(reply) == [(5, 0), (4, 0)]
        assert reply.num_truncated == 3
        assert reply.num_status_task_events_dropped == 3
        assert reply.num_total_stored == 5

    async def test_finished_attempts_come_first_then_actor_tasks_then_the_rest(self, stubs) -> None:
        await add(stubs, task(1, states={RUN: 1}))
        await add(stubs, task(2, states={RUN: 2}, kind=common_pb2.ACTOR_TASK))
        await add(stubs, task(3, states={RUN: 3}))
        await add(stubs, task(4, states={RUN: 4}))
        await add(stubs, task(1, states={DONE: 5}))  # moves into the finished group
        reply = await stubs.tasks.GetTaskEvents(G.GetTaskEventsRequest())
        assert ids(reply) == [(1, 0), (2, 0), (4, 0), (3, 0)]

    async def test_a_retried_tasks_attempts_come_newest_first(self, stubs) -> None:
        await add(stubs, task(7, attempt=0, states={common_pb2.FAILED: 1}))
        await add(stubs, task(7, attempt=1, states={common_pb2.FAILED: 2}))
        await add(stubs, task(7, attempt=2, states={DONE: 3}))
        only = F(
            task_filters=[F.TaskIdFilter(predicate=G.EQUAL, task_id=(7).to_bytes(24, "little"))]
        )
        reply = await stubs.tasks.GetTaskEvents(G.GetTaskEventsRequest(filters=only))
        assert ids(reply) == [(7, 2), (7, 1), (7, 0)]

    async def test_a_negative_limit_is_no_limit(self, stubs) -> None:
        for n in range(3):
            await add(stubs, task(n + 1, states={RUN: n}))
        reply = await stubs.tasks.GetTaskEvents(G.GetTaskEventsRequest(limit=-1))
        assert reply.status.code == 0 and len(reply.events_by_task) == 3

    async def test_an_unknown_predicate_is_rays_in_reply_invalid_argument(self, stubs) -> None:
        await add(stubs, task(1, states={RUN: 1}))
        bad = F(job_filters=[F.JobIdFilter(predicate=5, job_id=J1)])
        reply = await stubs.tasks.GetTaskEvents(G.GetTaskEventsRequest(filters=bad))
        assert reply.status.code == INVALID_ARGUMENT
        assert reply.status.message.startswith("Unknown filter predicate")
        assert not reply.events_by_task

    async def test_the_state_filter_compares_rays_state(self, stubs) -> None:
        """Ray's state filter reads the highest-numbered state reported, case-insensitive."""
        await add(stubs, task(1, states={RUN: 5, common_pb2.PENDING_NODE_ASSIGNMENT: 9}))
        running = F(state_filters=[F.StateFilter(predicate=G.EQUAL, state="running")])
        reply = await stubs.tasks.GetTaskEvents(G.GetTaskEventsRequest(filters=running))
        assert ids(reply) == [(1, 0)]


class TestRayStyleErrors:
    async def test_drain_with_a_negative_deadline_says_what_ray_says(self, stubs) -> None:
        """ABORTED with the code name alone as details and Ray's message as the binary
        error details: Ray 2.60's client rebuilds Invalid("Draining deadline ...") from
        that (details "Invalid: ..." became a bare OSError())."""
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stubs.autoscaler.DrainNode(
                A.DrainNodeRequest(node_id=b"\x05" * 28, deadline_timestamp_ms=-1)
            )
        err = info.value
        assert (err.code(), err.details()) == (grpc.StatusCode.ABORTED, "Invalid")
        trailers = dict(err.trailing_metadata() or ())
        assert (
            trailers[RAY_STATUS_DETAILS_KEY]
            == b"Draining deadline must be non-negative, received -1"
        )
        assert ray_message(err) == "Invalid: Draining deadline must be non-negative, received -1"

    @pytest.mark.parametrize(
        ("stub", "method", "request_"),
        [
            ("actors", "GetAllActorInfo", G.GetAllActorInfoRequest(limit=-1)),
            ("node_info", "GetAllNodeInfo", G.GetAllNodeInfoRequest(limit=-1)),
            (
                "node_info",
                "GetAllNodeAddressAndLiveness",
                G.GetAllNodeAddressAndLivenessRequest(limit=-1),
            ),
            ("workers", "GetAllWorkerInfo", G.GetAllWorkerInfoRequest(limit=-1)),
            (
                "runtime_env",
                "PinRuntimeEnvURI",
                G.PinRuntimeEnvURIRequest(uri="gcs://x.zip", expiration_s=-1),
            ),
            (
                "actors",
                "ReportActorOutOfScope",
                G.ReportActorOutOfScopeRequest(actor_id=b"\x01" * 16),
            ),
        ],
    )
    async def test_what_ray_answers_ok_is_ok(self, stubs, stub, method, request_) -> None:
        """Measured on Ray 2.60: a negative limit is no limit, a negative pin expiry and an
        unknown actor's out-of-scope report are accepted."""
        reply = await getattr(getattr(stubs, stub), method)(request_)
        assert reply.status.code == 0

    async def test_lineage_restart_of_an_unknown_actor_is_permanently_dead(self, stubs) -> None:
        reply = await stubs.actors.RestartActorForLineageReconstruction(
            G.RestartActorForLineageReconstructionRequest(
                actor_id=b"\x01" * 16, num_restarts_due_to_lineage_reconstruction=1
            )
        )
        assert (reply.status.code, reply.status.message) == (INVALID, "Actor is permanently dead.")


class TestRayStatusOnEveryPath:
    async def test_the_grpc_aio_path_sends_the_message_as_error_details(self) -> None:
        """``front_server: false`` answers from grpc.aio: the same trailer."""
        from gcs.rpc import ServiceStub
        from gcs.rpc import descriptors as svc
        from gcs.server.app import GcsServer
        from gcs.store.memory import MemoryStore
        from tests.conftest import fast_config

        server = GcsServer(fast_config(front_server=False), store=MemoryStore())
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = ServiceStub(channel, svc.AUTOSCALER_STATE, timeout_s=30)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.DrainNode(
                        A.DrainNodeRequest(node_id=b"\x05" * 28, deadline_timestamp_ms=-2)
                    )
        finally:
            await server.stop()
        assert info.value.details() == "Invalid"
        assert ray_message(info.value).endswith("must be non-negative, received -2")

    async def test_the_pubsub_path_sends_the_message_as_error_details(self, gcs_server) -> None:
        """Pubsub refusals (answered by the front server's hot path) carry it too."""
        from gcs.proto import pubsub_pb2
        from gcs.rpc import ServiceStub
        from gcs.rpc import descriptors as svc

        cmd = pubsub_pb2.Command(channel_type=pubsub_pb2.RAY_LOG_CHANNEL)
        cmd.subscribe_message.SetInParent()
        async with grpc.aio.insecure_channel(gcs_server.address) as channel:
            stub = ServiceStub(channel, svc.CONTROL_PLANE_PUBSUB, timeout_s=30)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GcsSubscriberCommandBatch(
                    G.GcsSubscriberCommandBatchRequest(subscriber_id=b"s" * 28, commands=[cmd])
                )
        assert info.value.details() == "InvalidArgument"
        assert ray_message(info.value).startswith("InvalidArgument: ")
        assert len(ray_message(info.value)) > len("InvalidArgument: ")
