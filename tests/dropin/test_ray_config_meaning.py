"""What the ends of Ray's ranges mean here, as they mean in Ray 2.60's GCS:

* ``gcs_pull_resource_loads_period_milliseconds: 0``: no load pull at all (Ray's periodic
  runner skips a zero period), not a busy loop;
* ``node_instances_replenish_interval_ms`` / ``expired_job_clusters_gc_interval_ms: 0``:
  off (ant-ray's periodic runner);
* ``task_events_max_num_task_in_gcs`` <= 0: no limit; ``..._profile_events_per_task`` < 0:
  no limit, 0: none kept;
* ``health_check_initial_delay_ms: 0``: the first check is due at once (within the jitter of
  one period); ``health_check_failure_threshold: 0``: the first failed check is fatal.
"""

from __future__ import annotations

import asyncio
import random

from gcs.base.clock import FakeClock
from gcs.config import HealthCheckConfig, LoadPollConfig
from gcs.managers.events import NodeEvents
from gcs.managers.health import HealthChecker
from gcs.managers.load_poller import LoadPoller
from gcs.managers.nodes import NodeManager
from gcs.managers.resources import ResourceCache
from gcs.managers.tasks import TaskEventStore
from gcs.managers.virtual_clusters import VirtualClusterManager
from gcs.proto import gcs_pb2, gcs_service_pb2
from gcs.store.memory import MemoryStore
from gcs.testing.fake_raylets import FakeRayletGateway

NODE = b"\x01" * 28
JOB = b"\x01\x00\x00\x00"


async def _yield_loop(times: int = 20) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


async def _one_node(nodes: NodeManager) -> NodeManager:
    await nodes.register(
        gcs_pb2.GcsNodeInfo(
            node_id=NODE,
            node_manager_address="127.0.0.2",
            node_manager_port=4000,
            state=gcs_pb2.GcsNodeInfo.ALIVE,
        )
    )
    return nodes


class TestZeroPeriodIsOff:
    async def test_load_pull_with_a_zero_period_never_polls(self) -> None:
        clock = FakeClock()
        cache = ResourceCache(clock)
        nodes = await _one_node(NodeManager(MemoryStore(), clock, events=NodeEvents(cache)))
        raylets = FakeRayletGateway()
        poller = LoadPoller(nodes, cache, raylets, clock, LoadPollConfig(period_ms=0))
        task = asyncio.create_task(poller.run())
        await _yield_loop()
        assert not task.done()
        assert raylets.calls_to("GetResourceLoad") == []
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def test_periodic_virtual_cluster_work_with_a_zero_period_never_runs(self) -> None:
        steps: list[int] = []

        async def step() -> None:
            steps.append(1)

        # run_periodic reads nothing else from the manager
        task = asyncio.create_task(
            VirtualClusterManager.run_periodic(None, 0, step, "replenish")  # type: ignore[arg-type]
        )
        await _yield_loop()
        assert steps == [] and not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class TestTaskEventLimits:
    def _add(self, store: TaskEventStore, n: int, profile_events: int = 0) -> None:
        data = gcs_pb2.TaskEventData(job_id=JOB)
        for i in range(n):
            events = data.events_by_task.add(
                task_id=i.to_bytes(24, "big"), attempt_number=0, job_id=JOB
            )
            # Ray's GetTaskEvents lists an attempt only once its task info arrived
            events.task_info.name = f"t{i}"
            for _ in range(profile_events):
                events.profile_events.events.add(event_name="e")
        store.add(data)

    def test_a_task_limit_of_zero_or_below_is_no_limit(self) -> None:
        for limit in (0, -1):
            store = TaskEventStore(max_tasks=limit)
            self._add(store, 300)
            assert len(store) == 300 and store.evicted == 0

    def test_a_negative_profile_limit_keeps_every_event_and_zero_keeps_none(self) -> None:
        unlimited = TaskEventStore(max_profile_events_per_task=-1)
        self._add(unlimited, 1, profile_events=2500)
        none = TaskEventStore(max_profile_events_per_task=0)
        self._add(none, 1, profile_events=5)
        (held,) = unlimited.query(gcs_service_pb2.GetTaskEventsRequest()).events_by_task
        assert len(held.profile_events.events) == 2500
        reply = none.query(gcs_service_pb2.GetTaskEventsRequest())
        assert len(reply.events_by_task[0].profile_events.events) == 0
        assert reply.num_profile_task_events_dropped == 5


class TestHealthCheckEnds:
    async def _checker(
        self, config: HealthCheckConfig, raylets: FakeRayletGateway
    ) -> tuple[FakeClock, NodeManager, HealthChecker]:
        clock = FakeClock()
        events = NodeEvents()
        nodes = NodeManager(MemoryStore(), clock, events=events)
        health = HealthChecker(nodes, raylets, clock, config, rng=random.Random(3))
        events.subscribe(health)
        await _one_node(nodes)
        return clock, nodes, health

    async def test_zero_initial_delay_checks_within_one_period(self) -> None:
        raylets = FakeRayletGateway()
        config = HealthCheckConfig(initial_delay_ms=0, period_ms=1000, failure_threshold=3)
        clock, _, health = await self._checker(config, raylets)
        clock.advance(1.0)
        assert health.tick() == 1

    async def test_zero_threshold_fails_the_node_at_its_first_failed_check(self) -> None:
        raylets = FakeRayletGateway(unreachable={NODE})
        config = HealthCheckConfig(initial_delay_ms=0, period_ms=1000, failure_threshold=0)
        clock, nodes, health = await self._checker(config, raylets)
        clock.advance(1.0)
        assert health.tick() == 1
        await _yield_loop(50)
        assert NODE not in nodes.alive and NODE in nodes.dead
