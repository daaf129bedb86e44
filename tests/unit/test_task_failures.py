"""Unfinished task attempts of a dead worker or a finished job are failed as Ray's
``GcsTaskManager`` does: after Ray's delays, WORKER_DIED with Ray's messages, finished and
failed attempts untouched (fake clock: no wall time)."""

from __future__ import annotations

import asyncio

from gcs.base.clock import FakeClock
from gcs.managers.events import JobEvents, NodeEvents
from gcs.managers.jobs import JobManager
from gcs.managers.task_failures import TaskFailureMarker
from gcs.managers.tasks import TaskEventStore, latest_state
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2
from gcs.store.memory import MemoryStore

J1, J2 = b"\x01\x00\x00\x00", b"\x02\x00\x00\x00"
W1, W2 = b"\x11" * 28, b"\x22" * 28
RUNNING, FINISHED, FAILED = common_pb2.RUNNING, common_pb2.FINISHED, common_pb2.FAILED


def _task(n: int, *, job: bytes = J1, worker: bytes = b"", state: int = RUNNING):
    events = gcs_pb2.TaskEvents(
        task_id=n.to_bytes(24, "little"),
        job_id=job,
        task_info=common_pb2.TaskInfoEntry(type=common_pb2.NORMAL_TASK, name=f"t{n}", job_id=job),
    )
    events.state_updates.state_ts_ns[common_pb2.PENDING_NODE_ASSIGNMENT] = 1_000
    events.state_updates.state_ts_ns[state] = 2_000
    if worker:
        events.state_updates.worker_id = worker
    return events


def _store(*events: gcs_pb2.TaskEvents) -> TaskEventStore:
    store = TaskEventStore()
    for e in events:
        store.add(gcs_pb2.TaskEventData(events_by_task=[e], job_id=e.job_id))
    return store


def _by_name(store: TaskEventStore) -> dict[str, gcs_pb2.TaskEvents]:
    reply = store.query(gcs_service_pb2.GetTaskEventsRequest())
    return {e.task_info.name: e for e in reply.events_by_task}


def _failure(worker: bytes, end_ms: int = 5_000) -> gcs_pb2.WorkerTableData:
    return gcs_pb2.WorkerTableData(
        worker_address=common_pb2.Address(worker_id=worker),
        exit_type=common_pb2.SYSTEM_ERROR,
        exit_detail="killed by a test",
        end_time_ms=end_ms,
    )


def test_a_dead_workers_running_attempts_fail_with_rays_error_and_others_stay() -> None:
    store = _store(
        _task(1, worker=W1),
        _task(2, worker=W1, state=FINISHED),
        _task(3, worker=W2),
        _task(4),  # no worker yet (pending)
    )
    assert store.fail_worker_tasks(W1, _failure(W1)) == 1
    rows = _by_name(store)
    assert latest_state(rows["t1"]) == FAILED
    assert rows["t1"].state_updates.state_ts_ns[FAILED] == 5_000 * 1_000_000
    error = rows["t1"].state_updates.error_info
    assert error.error_type == common_pb2.WORKER_DIED
    assert error.error_message == (
        f"Worker running the task ({W1.hex()}) died with exit_type: "
        f"{common_pb2.SYSTEM_ERROR} with error_message: killed by a test"
    )
    assert (
        latest_state(rows["t2"]) == FINISHED and FAILED not in rows["t2"].state_updates.state_ts_ns
    )
    assert latest_state(rows["t3"]) == RUNNING
    assert latest_state(rows["t4"]) == RUNNING
    assert store.fail_worker_tasks(W1, _failure(W1)) == 0, "idempotent"


def test_a_finished_jobs_unfinished_attempts_fail_with_rays_message() -> None:
    store = _store(_task(1), _task(2, state=FINISHED), _task(3, job=J2), _task(4, worker=W1))
    assert store.fail_job_tasks(J1, 7_000) == 2
    rows = _by_name(store)
    for name in ("t1", "t4"):
        assert latest_state(rows[name]) == FAILED
        assert rows[name].state_updates.error_info.error_message == (
            f"Job finishes ({J1.hex()}) as driver exits. Marking all non-terminal tasks as failed."
        )
    assert latest_state(rows["t2"]) == FINISHED
    assert latest_state(rows["t3"]) == RUNNING


def test_a_failed_attempt_is_never_stamped_before_its_last_state() -> None:
    store = _store(_task(1, worker=W1))
    store.fail_worker_tasks(W1, _failure(W1, end_ms=0))  # no end time reported
    [row] = _by_name(store).values()
    assert latest_state(row) == FAILED
    assert row.state_updates.state_ts_ns[FAILED] >= 2_000


def test_failed_attempts_are_evicted_first_like_finished_ones() -> None:
    store = TaskEventStore(max_tasks=2)
    for e in (_task(1, worker=W1), _task(2)):
        store.add(gcs_pb2.TaskEventData(events_by_task=[e], job_id=J1))
    store.fail_worker_tasks(W1, _failure(W1))
    store.add(gcs_pb2.TaskEventData(events_by_task=[_task(3)], job_id=J1))
    assert set(_by_name(store)) == {"t2", "t3"}
    assert store.fail_worker_tasks(W1, _failure(W1)) == 0  # the index forgot the evicted one


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_marker_waits_rays_delays_on_the_clock() -> None:
    clock = FakeClock()
    store = _store(_task(1, worker=W1), _task(2, job=J2))
    marker = TaskFailureMarker(store, clock, worker_dead_delay_ms=1000, job_done_delay_ms=15000)
    marker.on_worker_dead(_failure(W1))  # a worker and job listener
    marker.on_job_finished(gcs_pb2.JobTableData(job_id=J2, is_dead=True, end_time=9_000))
    await _settle()
    clock.advance(0.999)
    await _settle()
    assert latest_state(_by_name(store)["t1"]) == RUNNING, "not before the worker delay"
    # the worker's last events arrive in the window: a finished attempt is not failed
    clock.advance(0.001)
    await _settle()
    assert latest_state(_by_name(store)["t1"]) == FAILED
    clock.advance(13.9)
    await _settle()
    assert latest_state(_by_name(store)["t2"]) == RUNNING, "not before the job delay"
    clock.advance(0.1)
    await _settle()
    assert latest_state(_by_name(store)["t2"]) == FAILED
    assert marker.pending == 0
    await marker.close()


async def test_events_arriving_within_the_delay_win_and_close_cancels_pending_marks() -> None:
    clock = FakeClock()
    store = _store(_task(1, worker=W1))
    marker = TaskFailureMarker(store, clock)
    marker.on_worker_dead(_failure(W1))
    await _settle()
    store.add(
        gcs_pb2.TaskEventData(events_by_task=[_task(1, worker=W1, state=FINISHED)], job_id=J1)
    )
    clock.advance(1.0)
    await _settle()
    assert latest_state(_by_name(store)["t1"]) == FINISHED
    marker.on_job_finished(gcs_pb2.JobTableData(job_id=J1, is_dead=True, end_time=9_000))
    await _settle()
    assert marker.pending == 1
    await marker.close()
    assert marker.pending == 0


async def test_a_dead_drivers_node_finishes_its_jobs_and_then_their_tasks_fail() -> None:
    """Ray's GcsJobManager::OnNodeDead: no raylet is left to report the driver's exit."""
    clock = FakeClock()
    job_events = JobEvents()
    jobs = JobManager(MemoryStore(), clock, events=job_events)
    node_events = NodeEvents(jobs.node_listener)
    on_node, elsewhere = b"\x0a" * 28, b"\x0b" * 28
    for job_id, node_id in ((J1, on_node), (J2, elsewhere)):
        await jobs.add(
            gcs_pb2.JobTableData(job_id=job_id, driver_address=common_pb2.Address(node_id=node_id))
        )
    store = _store(_task(1, job=J1), _task(2, job=J2))
    marker = TaskFailureMarker(store, clock)
    job_events.subscribe(marker)
    for listener in node_events:
        listener.on_node_dead(gcs_pb2.GcsNodeInfo(node_id=on_node))
    await _settle()
    assert jobs.jobs[J1].is_dead and not jobs.jobs[J2].is_dead
    clock.advance(15)
    await _settle()
    rows = _by_name(store)
    assert latest_state(rows["t1"]) == FAILED and latest_state(rows["t2"]) == RUNNING
    await marker.close()
    await jobs.close()
