"""Task events: merged per attempt, bounded with Ray's limits, drops counted per job, filters."""

from __future__ import annotations

import pytest

from gcs.base.errors import InvalidArgument
from gcs.managers.tasks import TaskEventStore, latest_state
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2

J1, J2 = b"\x01\x00\x00\x00", b"\x02\x00\x00\x00"
F = gcs_service_pb2.GetTaskEventsRequest.Filters


def _task(
    n: int,
    job: bytes = J1,
    *,
    states: dict[int, int] | None = None,
    kind: int = common_pb2.NORMAL_TASK,
    name: str = "f",
    profile: int = 0,
) -> gcs_pb2.TaskEvents:
    events = gcs_pb2.TaskEvents(
        task_id=n.to_bytes(24, "little"),
        job_id=job,
        task_info=common_pb2.TaskInfoEntry(type=kind, name=name, job_id=job),
    )
    for state, ts in (states or {common_pb2.PENDING_NODE_ASSIGNMENT: n}).items():
        events.state_updates.state_ts_ns[state] = ts
    for i in range(profile):
        events.profile_events.events.add(event_name=f"e{i}")
    return events


def _add(store: TaskEventStore, *events: gcs_pb2.TaskEvents, job: bytes = J1, **kw) -> None:
    store.add(gcs_pb2.TaskEventData(events_by_task=events, job_id=job, **kw))


def _query(store: TaskEventStore, **kw) -> gcs_service_pb2.GetTaskEventsReply:
    return store.query(gcs_service_pb2.GetTaskEventsRequest(**kw))


def test_events_of_one_attempt_merge_and_the_newest_state_wins() -> None:
    store = TaskEventStore()
    _add(store, _task(1, states={common_pb2.PENDING_NODE_ASSIGNMENT: 10}))
    _add(store, _task(1, states={common_pb2.RUNNING: 20}))
    _add(store, _task(1, states={common_pb2.FINISHED: 30}))
    [events] = _query(store).events_by_task
    assert latest_state(events) == common_pb2.FINISHED
    assert len(events.state_updates.state_ts_ns) == 3
    assert len(store) == 1


def test_past_the_limit_finished_tasks_go_first_then_actor_tasks_and_drops_are_counted() -> None:
    store = TaskEventStore(max_tasks=3)
    _add(store, _task(1, kind=common_pb2.ACTOR_TASK))
    _add(store, _task(2))
    _add(store, _task(3, states={common_pb2.FINISHED: 5}))
    _add(store, _task(4))  # evicts 3 (finished), though 1 and 2 are older
    kept = {int.from_bytes(e.task_id, "little") for e in _query(store).events_by_task}
    assert kept == {1, 2, 4}
    _add(store, _task(5))  # evicts 1 (actor task) before the normal pending tasks
    kept = {int.from_bytes(e.task_id, "little") for e in _query(store).events_by_task}
    assert kept == {2, 4, 5}
    reply = _query(store)
    assert reply.num_status_task_events_dropped == 2
    assert reply.num_total_stored == 3


def test_worker_reported_drops_and_profile_overflow_count_per_job() -> None:
    store = TaskEventStore(max_profile_events_per_task=4)
    _add(store, _task(1, profile=3))
    _add(store, _task(1, profile=3))  # 6 > 4: the two oldest dropped
    _add(
        store,
        _task(2, job=J2),
        job=J2,
        num_profile_events_dropped=5,
        dropped_task_attempts=[common_pb2.TaskAttempt(task_id=(2).to_bytes(24, "little"))],
    )
    assert len(_query(store).events_by_task) == 1  # task 2's attempt was reported dropped
    one = _query(store, filters=F(job_filters=[F.JobIdFilter(job_id=J1)]))
    assert one.num_profile_task_events_dropped == 2
    assert len(one.events_by_task[0].profile_events.events) == 4
    two = _query(store, filters=F(job_filters=[F.JobIdFilter(job_id=J2)]))
    assert (two.num_profile_task_events_dropped, two.num_status_task_events_dropped) == (5, 1)


def test_filters_limit_and_counts() -> None:
    store = TaskEventStore()
    _add(store, _task(1, name="alpha", states={common_pb2.FINISHED: 1}))
    _add(store, _task(2, name="beta"))
    _add(store, _task(3, kind=common_pb2.DRIVER_TASK, name="driver"))
    _add(store, _task(4, J2, name="alpha"), job=J2)
    by_name = _query(store, filters=F(task_name_filters=[F.TaskNameFilter(task_name="ALPHA")]))
    assert len(by_name.events_by_task) == 2 and by_name.num_filtered_on_gcs == 2
    not_equal = F.JobIdFilter(predicate=gcs_service_pb2.NOT_EQUAL, job_id=J1)
    not_j1 = _query(store, filters=F(job_filters=[not_equal]))
    assert [e.job_id for e in not_j1.events_by_task] == [J2]
    finished = _query(store, filters=F(state_filters=[F.StateFilter(state="finished")]))
    assert [e.task_info.name for e in finished.events_by_task] == ["alpha"]
    no_driver = _query(store, filters=F(exclude_driver=True))
    assert "driver" not in {e.task_info.name for e in no_driver.events_by_task}
    limited = _query(store, limit=1)
    assert len(limited.events_by_task) == 1 and limited.num_truncated == 3


def test_an_event_without_task_id_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidArgument, match=r"events_by_task\[0\]\.task_id"):
        _add(TaskEventStore(), gcs_pb2.TaskEvents(job_id=J1))


def test_drop_counts_saturate_at_int32() -> None:
    """The reply's counters are int32; workers can report more in total."""
    store = TaskEventStore()
    for _ in range(3):
        _add(store, num_profile_events_dropped=2**31 - 1)
    assert _query(store).num_profile_task_events_dropped == 2**31 - 1
