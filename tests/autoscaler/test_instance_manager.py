"""Instance manager: Ray 2.60's lifecycle table and update semantics (§2.1-2.3, §5.3)."""

from __future__ import annotations

import asyncio
import itertools
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gcs.autoscaler.instances import (
    VALID_TRANSITIONS,
    InstanceEvent,
    InstanceManager,
    InstanceUpdate,
    MemoryInstanceStorage,
    StoreInstanceStorage,
    UpdateStatus,
    is_ray_running_reachable,
    reachable_from,
)
from gcs.autoscaler.instances.model import decode_instance, encode_instance
from gcs.autoscaler.instances.transitions import CLOUD_ALLOCATED_STATUSES, RAY_RUNNING_STATUSES
from gcs.base.clock import FakeClock
from gcs.policy.autoscaling.model import InstanceStatus as S
from gcs.policy.autoscaling.model import NodeKind
from gcs.policy.autoscaling.scheduler.types import SCHEDULABLE_STATUSES
from gcs.store.memory import MemoryStore


class Recorder:
    def __init__(self) -> None:
        self.events: list[InstanceEvent] = []

    def notify(self, events) -> None:  # type: ignore[no-untyped-def]
        self.events.extend(events)


def manager(storage=None):  # type: ignore[no-untyped-def]
    rec = Recorder()
    im = InstanceManager(storage or MemoryInstanceStorage(), FakeClock(), subscribers=[rec])
    return im, rec


def queued(iid: str, itype: str = "type-1") -> InstanceUpdate:
    return InstanceUpdate(iid, S.QUEUED, upsert=True, instance_type=itype)


class TestLifecycleTable:
    def test_table_is_rays_verified_dump(self) -> None:
        """Spot checks of §2.2 plus its shape: every status has a row."""
        assert set(VALID_TRANSITIONS) == set(S)
        assert VALID_TRANSITIONS[S.QUEUED] == {S.REQUESTED, S.TERMINATED}
        assert VALID_TRANSITIONS[S.REQUESTED] == {S.ALLOCATED, S.QUEUED, S.ALLOCATION_FAILED}
        assert S.TERMINATING in VALID_TRANSITIONS[S.ALLOCATED]  # ray#50868
        assert S.TERMINATING in VALID_TRANSITIONS[S.RAY_INSTALLING]  # ray#60412
        assert VALID_TRANSITIONS[S.RAY_STOP_REQUESTED] == {
            S.RAY_STOPPING,
            S.RAY_STOPPED,
            S.RAY_RUNNING,
            S.TERMINATED,
        }
        for terminal in (S.TERMINATED, S.ALLOCATION_FAILED, S.UNKNOWN):
            assert not VALID_TRANSITIONS[terminal]

    def test_reachability_derived_from_the_table(self) -> None:
        assert S.RAY_RUNNING in reachable_from(S.RAY_RUNNING)
        assert S.RAY_STOP_REQUESTED in reachable_from(S.RAY_STOP_REQUESTED)
        assert S.QUEUED in reachable_from(S.REQUESTED) and S.REQUESTED in reachable_from(S.QUEUED)
        running_reachable = {s for s in S if is_ray_running_reachable(s)}
        assert running_reachable == set(SCHEDULABLE_STATUSES)
        assert {S.RAY_RUNNING, S.RAY_STOP_REQUESTED} == RAY_RUNNING_STATUSES
        assert S.QUEUED not in CLOUD_ALLOCATED_STATUSES


class TestUpdates:
    async def test_version_mismatch_changes_nothing(self) -> None:
        im, rec = manager()
        await im.update([queued("i-0")])
        assert im.version == 1
        bad = await im.update([queued("i-1")], expected_version=0)
        assert bad.status is UpdateStatus.VERSION_MISMATCH and im.get("i-1") is None
        good = await im.update([queued("i-1")], expected_version=1)
        assert good.ok and good.version == 2
        assert [e.instance.instance_id for e in rec.events] == ["i-0", "i-1"]

    async def test_storage_failures_notify_nobody(self) -> None:
        storage = MemoryInstanceStorage()
        im, rec = manager(storage)
        storage.fail_next = RuntimeError("disk gone")
        result = await im.update([queued("i-0")])
        assert result.status is UpdateStatus.STORAGE_ERROR
        assert rec.events == [] and im.get("i-0") is None and im.storage_failures == 1
        assert (await im.update([queued("i-0")])).ok

    async def test_a_caller_cancelled_after_the_write_still_gets_it_applied_and_told(
        self,
    ) -> None:
        """The lane finishes a batch whose write is under way (memory and subscribers follow
        storage) before the caller's cancellation goes on; the next batch then waits."""

        class SlowAck(MemoryInstanceStorage):
            def __init__(self) -> None:
                super().__init__()
                self.written = asyncio.Event()
                self.ack = asyncio.Event()

            async def write(self, expected_version, upserts, deletes):  # type: ignore[no-untyped-def]
                version = await super().write(expected_version, upserts, deletes)
                self.written.set()
                await self.ack.wait()  # the write landed; its reply is slow
                return version

        storage = SlowAck()
        im, rec = manager(storage)
        caller = asyncio.ensure_future(im.update([queued("i-0")]))
        await storage.written.wait()
        caller.cancel()
        after = asyncio.ensure_future(im.update([queued("i-1")]))
        storage.ack.set()
        with pytest.raises(asyncio.CancelledError):
            await caller
        storage.ack.set()
        assert (await after).ok
        assert [e.instance.instance_id for e in rec.events] == ["i-0", "i-1"]
        assert set(im.instances) == {"i-0", "i-1"} and im.version == storage.version == 2

    async def test_get_and_updates(self) -> None:
        """§5.3 get_and_updates: invalid transition rejected, whole batch untouched."""
        im, rec = manager()
        ok = await im.update([queued("i-1"), queued("i-2", "type-2"), queued("i-3", "type-2")])
        assert ok.ok and len(rec.events) == 3
        ok = await im.update(
            [
                InstanceUpdate("i-1", S.REQUESTED, launch_request_id="l1", instance_type="type-1"),
                InstanceUpdate("i-2", S.REQUESTED, launch_request_id="l1", instance_type="type-2"),
            ]
        )
        assert ok.ok and len(rec.events) == 5
        bad = await im.update(
            [
                InstanceUpdate("i-3", S.REQUESTED, launch_request_id="l2", instance_type="type-2"),
                InstanceUpdate("i-1", S.RAY_RUNNING, ray_node_id="r-1"),  # REQUESTED -> RUNNING
            ]
        )
        assert bad.status is UpdateStatus.INVALID_UPDATE
        assert "REQUESTED -> RAY_RUNNING" in bad.message
        assert im.get("i-3").status is S.QUEUED  # type: ignore[union-attr]
        assert len(rec.events) == 5 and im.invalid_updates == 1
        stale = await im.update([queued("i-9")], expected_version=0)
        assert stale.status is UpdateStatus.VERSION_MISMATCH

    async def test_insert_rules(self) -> None:
        im, rec = manager()
        ok = await im.update(
            [
                queued("i-1"),
                InstanceUpdate("i-2", S.TERMINATING, upsert=True, cloud_instance_id="c-2"),
                InstanceUpdate(
                    "i-3",
                    S.ALLOCATED,
                    upsert=True,
                    cloud_instance_id="c-3",
                    node_kind=NodeKind.WORKER,
                    instance_type="type-3",
                ),
            ]
        )
        assert ok.ok
        assert im.get("i-2").cloud_instance_id == "c-2"  # type: ignore[union-attr]
        assert im.get("i-3").instance_type == "type-3"  # type: ignore[union-attr]
        not_upsert = await im.update([InstanceUpdate("i-4", S.QUEUED, instance_type="t")])
        assert not_upsert.status is UpdateStatus.INVALID_UPDATE
        for status in set(S) - {S.QUEUED, S.TERMINATING, S.ALLOCATED}:
            result = await im.update([InstanceUpdate("i-5", status, upsert=True)])
            assert result.status is UpdateStatus.INVALID_UPDATE, status
        assert len(rec.events) == 3

    async def test_apply_update_path_and_fields(self) -> None:
        """§5.3 apply_update: QUEUED -> REQUESTED -> ALLOCATED -> RAY_RUNNING -> TERMINATED."""
        im, _ = manager()
        await im.update([queued("i-1")])
        steps = [
            InstanceUpdate("i-1", S.REQUESTED, launch_request_id="l1", instance_type="type-1"),
            InstanceUpdate(
                "i-1",
                S.ALLOCATED,
                cloud_instance_id="cloud-id-1",
                node_kind=NodeKind.WORKER,
                instance_type="type-1",
            ),
            InstanceUpdate("i-1", S.RAY_RUNNING, ray_node_id="ray-node-1"),
            InstanceUpdate("i-1", S.TERMINATED, details="gone"),
        ]
        for version, step in enumerate(steps, start=2):
            result = await im.update([step], expected_version=version - 1)
            assert result.ok and result.version == version
        inst = im.get("i-1")
        assert inst is not None
        assert (inst.launch_request_id, inst.cloud_instance_id, inst.node_id) == (
            "l1",
            "cloud-id-1",
            "ray-node-1",
        )
        assert [h.status for h in inst.history] == [
            S.QUEUED,
            S.REQUESTED,
            S.ALLOCATED,
            S.RAY_RUNNING,
            S.TERMINATED,
        ]
        assert inst.latest_details() == "gone"

    async def test_required_fields(self) -> None:
        im, _ = manager()
        await im.update([queued("i-1")])
        missing = await im.update([InstanceUpdate("i-1", S.REQUESTED, instance_type="type-1")])
        assert missing.status is UpdateStatus.INVALID_UPDATE
        assert "launch_request_id" in missing.message

    async def test_terminal_instances_are_pruned_oldest_first(self) -> None:
        clock = FakeClock()
        im = InstanceManager(MemoryInstanceStorage(), clock, retain_terminal=2)
        for n in range(4):
            await im.update([queued(f"i-{n}")])
            clock.advance(1)
            await im.update([InstanceUpdate(f"i-{n}", S.TERMINATED)])
        assert sorted(im.instances) == ["i-2", "i-3"]


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def store(request, tmp_path):  # type: ignore[no-untyped-def]
    if request.param == "memory":
        yield MemoryStore()
        return
    from gcs.store import store_from_url

    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path}/gcs.sqlite3"
    else:
        url = request.getfixturevalue("redis_server").url
    s = store_from_url(url, namespace=f"im-{uuid.uuid4().hex[:8]}")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


class TestStoreStorage:
    async def test_restart_resumes_instances_and_version(self, store) -> None:  # type: ignore[no-untyped-def]
        im, _ = manager(StoreInstanceStorage(store))
        await im.load()
        await im.update([queued("i-1"), queued("i-2")])
        await im.update(
            [InstanceUpdate("i-1", S.REQUESTED, launch_request_id="l1", instance_type="type-1")]
        )
        again, _ = manager(StoreInstanceStorage(store))
        await again.load()
        assert again.version == 2
        assert again.get("i-1") == im.get("i-1") and again.get("i-2") == im.get("i-2")

    async def test_two_writers_one_wins(self, store) -> None:  # type: ignore[no-untyped-def]
        a, _ = manager(StoreInstanceStorage(store))
        b, _ = manager(StoreInstanceStorage(store))
        await a.load()
        await b.load()
        assert (await a.update([queued("i-a")])).ok
        lost = await b.update([queued("i-b")])
        assert lost.status is UpdateStatus.VERSION_MISMATCH
        assert b.version == 1 and b.get("i-a") is not None  # re-read after the conflict
        assert (await b.update([queued("i-b")])).ok


STATUSES = st.sampled_from([s for s in S if s is not S.UNKNOWN])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), STATUSES), max_size=30))
async def test_random_updates_never_break_the_lifecycle(steps) -> None:  # type: ignore[no-untyped-def]
    """Whatever is asked, only table edges are ever stored and versions count batches."""
    im, rec = manager()
    for idx, status in steps:
        upd = InstanceUpdate(
            f"i-{idx}",
            status,
            upsert=True,
            instance_type="t",
            launch_request_id="l",
            cloud_instance_id=f"c-{idx}",
            node_kind=NodeKind.WORKER,
            ray_node_id=f"r-{idx}",
        )
        before = im.version
        result = await im.update([upd])
        assert im.version == before + (1 if result.ok else 0)
    for inst in im.instances.values():
        path = [h.status for h in inst.history]
        for old, new in itertools.pairwise(path):
            assert new in VALID_TRANSITIONS[old]
        assert decode_instance(encode_instance(inst)) == inst
    assert len(rec.events) == im.version


async def test_autoscaler_metrics_are_exported(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """gcs_autoscaler_* families: instances by status, rounds, events by kind (monotonic)."""
    from prometheus_client import generate_latest

    from gcs.autoscaler.config import parse_cluster_config
    from gcs.autoscaler.runtime import AutoscalerRuntime
    from gcs.rpc.security import Security
    from gcs.server.metrics import GcsMetrics

    cluster = parse_cluster_config(
        {"provider": {"type": "read-only"}, "available_node_types": {"head": {"resources": {}}}}
    )
    runtime = AutoscalerRuntime(
        cluster, "127.0.0.1:1", state_dir=tmp_path, store=MemoryStore(), security=Security()
    )
    try:
        await runtime.instances.update([queued("i-1", "head")])
        for _ in range(250):  # more than the log keeps: the counter must not fall back
            runtime.events.add("launch", "Adding 1 x head")
        metrics = GcsMetrics()
        metrics.add_source(runtime.metric_families)
        text = generate_latest(metrics.registry).decode()
        assert 'gcs_autoscaler_instances{status="QUEUED"} 1.0' in text
        assert 'gcs_autoscaler_events_total{kind="launch"} 250.0' in text
        assert "gcs_autoscaler_failed_rounds_total 0.0" in text
    finally:
        await runtime.stop()
