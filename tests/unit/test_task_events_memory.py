"""Task events are held compactly: what 10,000s of tiny tasks cost the GCS's memory."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from gcs.managers.tasks import TaskEventStore
from gcs.proto import common_pb2, gcs_pb2, gcs_service_pb2

PROBE = textwrap.dedent(
    """
    import gc
    from gcs.managers.tasks import TaskEventStore
    from gcs.proto import common_pb2, gcs_pb2

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    def batch(start, n, state, info):
        data = gcs_pb2.TaskEventData(job_id=b"\\x01\\x00\\x00\\x00")
        for i in range(start, start + n):
            e = data.events_by_task.add(task_id=i.to_bytes(24, "big"), job_id=data.job_id)
            e.state_updates.state_ts_ns[state] = 1_700_000_000_000_000_000 + i
            e.state_updates.worker_id = b"w" * 28
            if info:
                e.task_info.name = "tiny"
                e.task_info.func_or_class_name = "__main__.tiny"
                e.task_info.required_resources["CPU"] = 0.01
        return data

    N = 20_000
    store = TaskEventStore()
    store.add(batch(10**6, 100, common_pb2.PENDING_ARGS_AVAIL, True))  # allocator warmed
    gc.collect()
    before = rss()
    for start in range(0, N, 500):  # submitted with the task's info, then finished
        store.add(batch(start, 500, common_pb2.PENDING_ARGS_AVAIL, True))
        store.add(batch(start, 500, common_pb2.FINISHED, False))
    gc.collect()
    print((rss() - before) // N)
    """
)


def test_a_held_attempt_costs_well_under_a_protobuf_message_of_its_own() -> None:
    # held as a message each, an attempt of ~100 bytes cost ~3.2 KiB (its own upb arena);
    # held as bytes with its index entries, ~1 KiB
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    per_attempt = int(out.stdout)
    assert per_attempt < 2048, f"{per_attempt} bytes of memory per held task attempt"


def test_trimming_profile_events_leaves_the_callers_message_as_it_was() -> None:
    store = TaskEventStore(max_profile_events_per_task=2)
    events = gcs_pb2.TaskEvents(task_id=b"t" * 24, job_id=b"\x01\x00\x00\x00")
    events.task_info.type = common_pb2.NORMAL_TASK
    for i in range(5):
        events.profile_events.events.add(event_name=f"e{i}")
    data = gcs_pb2.TaskEventData(events_by_task=[events], job_id=events.job_id)
    store.add(data)
    assert len(data.events_by_task[0].profile_events.events) == 5
    [held] = store.query(gcs_service_pb2.GetTaskEventsRequest()).events_by_task
    assert [e.event_name for e in held.profile_events.events] == ["e3", "e4"]
    assert store.drops(events.job_id).profile == 3


def test_merging_by_appending_bytes_reads_as_protobufs_merge() -> None:
    # the held bytes grow by each report; read back they equal MergeFrom of the reports
    job = b"\x01\x00\x00\x00"
    reports = [gcs_pb2.TaskEvents(task_id=b"t" * 24, job_id=job) for _ in range(4)]
    reports[0].task_info.type = common_pb2.ACTOR_TASK
    reports[0].task_info.name = "f"
    reports[0].state_updates.state_ts_ns[common_pb2.PENDING_ARGS_AVAIL] = 1
    reports[1].state_updates.worker_id = b"w" * 28
    reports[1].state_updates.state_ts_ns[common_pb2.RUNNING] = 2
    reports[1].profile_events.events.add(event_name="a")
    reports[2].state_updates.state_ts_ns[common_pb2.RUNNING] = 3  # a later stamp wins
    reports[2].profile_events.events.add(event_name="b")
    reports[3].state_updates.state_ts_ns[common_pb2.FINISHED] = 4
    store = TaskEventStore()
    want = gcs_pb2.TaskEvents()
    for report in reports:
        store.add(gcs_pb2.TaskEventData(events_by_task=[report], job_id=job))
        want.MergeFrom(report)
        [got] = store.query(gcs_service_pb2.GetTaskEventsRequest()).events_by_task
        assert got == want
    assert store.fail_worker_tasks(b"w" * 28, gcs_pb2.WorkerTableData(end_time_ms=9)) == 0


def test_reports_past_the_profile_limit_keep_the_newest_and_count_the_rest() -> None:
    store = TaskEventStore(max_profile_events_per_task=3)
    job = b"\x01\x00\x00\x00"
    for report in range(4):  # 2 events each: the limit is passed at the second report
        events = gcs_pb2.TaskEvents(task_id=b"t" * 24, job_id=job)
        events.task_info.type = common_pb2.NORMAL_TASK
        for i in range(2):
            events.profile_events.events.add(event_name=f"r{report}e{i}")
        store.add(gcs_pb2.TaskEventData(events_by_task=[events], job_id=job))
    [held] = store.query(gcs_service_pb2.GetTaskEventsRequest()).events_by_task
    assert [e.event_name for e in held.profile_events.events] == ["r2e1", "r3e0", "r3e1"]
    assert store.drops(job).profile == 5
