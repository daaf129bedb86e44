"""Randomized state machine over the real reconciler in the simulated world.

Rules: task arrivals, time passing, provider failures and outages, lost cloud instances,
raylet deaths, and autoscaler restarts (a new instance manager and reconciler on the same
storage).  Invariants after every step:
- every stored instance's history follows the lifecycle table;
- no cloud instance leaks: each one is owned by a live instance within a round of appearing;
- no instance is terminated while its Ray node is alive with work on it;
- every launch is accounted for: each cloud instance ever launched is owned by an instance
  or was terminated.
"""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.instances import InstanceManager, MemoryInstanceStorage
from gcs.autoscaler.instances.transitions import TERMINAL_STATUSES, VALID_TRANSITIONS
from gcs.autoscaler.reconciler import (
    CloudInstanceUpdater,
    EventLog,
    RayStopper,
    ReconcileConfig,
    Reconciler,
)
from gcs.autoscaler.scheduler.types import NodeKind
from gcs.autoscaler.simulator.workload import CloudBehaviour, TaskBatch
from gcs.autoscaler.simulator.world import SimCloud, SimInstance, SimRay
from gcs.clock import FakeClock

CLUSTER = parse_cluster_config(
    {
        "max_workers": 12,
        "upscaling_speed": 1,
        "idle_timeout_minutes": 1,
        "head_node_type": "head",
        "available_node_types": {
            "head": {"resources": {"CPU": 0}, "max_workers": 0},
            "cpu4": {"resources": {"CPU": 4}, "max_workers": 12, "min_workers": 1},
            "gpu": {"resources": {"CPU": 2, "GPU": 1}, "max_workers": 3},
        },
    }
)
SHAPES = [{"CPU": 1}, {"CPU": 4}, {"GPU": 1}]
RECONCILE = ReconcileConfig(
    upscaling_speed=1,
    request_status_timeout_s=120,
    allocate_status_timeout_s=300,
    terminating_status_timeout_s=60,
    ray_stop_requested_status_timeout_s=60,
)


class WatchedCloud(SimCloud):
    """Records every terminate and checks no live Ray node with work is on it."""

    def __init__(self, clock: FakeClock, behaviour: CloudBehaviour) -> None:
        super().__init__(clock, behaviour)
        self.ray: SimRay | None = None
        self.violations: list[str] = []
        self.ever_launched: set[str] = set()
        self.outage = False

    async def get_non_terminated(self):  # type: ignore[no-untyped-def]
        if self.outage:
            raise RuntimeError("cloud API outage")
        return await super().get_non_terminated()

    async def launch(self, shape, request_id):  # type: ignore[no-untyped-def]
        before = set(self.instances)
        await super().launch(shape, request_id)
        self.ever_launched |= set(self.instances) - before

    async def terminate(self, cloud_instance_ids, request_id):  # type: ignore[no-untyped-def]
        assert self.ray is not None
        for cid in cloud_instance_ids:
            for node in self.ray.nodes.values():
                if node.cloud_id == cid and not node.dead and node.running:
                    self.violations.append(f"terminated {cid} with {node.running} tasks on it")
        await super().terminate(cloud_instance_ids, request_id)


class ReconcilerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock(start_s=0.0)
        self.behaviour = CloudBehaviour(launch_delay_s=20, boot_delay_s=10, seed=3)
        self.cloud = WatchedCloud(self.clock, self.behaviour)
        self.ray = SimRay(self.clock, CLUSTER, self.cloud, self.behaviour)
        self.cloud.ray = self.ray
        self.cloud.add_head("head")
        self.storage = MemoryInstanceStorage()
        self.ids = itertools.count(1)
        self.batches = itertools.count()
        self.last_ok_round_at = -1.0
        self._build_autoscaler()

    def _build_autoscaler(self) -> None:
        events = EventLog(self.clock)
        self.updater = CloudInstanceUpdater(self.cloud, self.clock, events)
        self.stopper = RayStopper(self.ray, events)
        self.im = InstanceManager(
            self.storage, self.clock, subscribers=[self.updater, self.stopper]
        )
        self.reconciler = Reconciler(
            instances=self.im,
            provider=self.cloud,
            gcs=self.ray,
            cluster=CLUSTER,
            clock=self.clock,
            events=events,
            updater=self.updater,
            stopper=self.stopper,
            config=RECONCILE,
            new_instance_id=lambda: f"i-{next(self.ids)}",
            new_request_id=lambda: f"r-{next(self.ids)}",
            schedule_in_thread=False,
        )

    def teardown(self) -> None:
        self.loop.close()

    def _run(self, coro) -> None:  # type: ignore[no-untyped-def]
        self.loop.run_until_complete(coro)

    async def _rounds(self, n: int) -> None:
        for _ in range(n):
            self.clock.advance(5)
            self.ray.step(self.clock.now_s())
            if await self.reconciler.reconcile_safely() is not None:
                self.last_ok_round_at = self.clock.now_s()
            await self.updater.settle()
            await self.stopper.settle()
            self.ray.step(self.clock.now_s())

    @rule(shape=st.sampled_from(SHAPES), count=st.integers(1, 12), minutes=st.integers(1, 20))
    def tasks_arrive(self, shape: dict, count: int, minutes: int) -> None:  # type: ignore[type-arg]
        self.ray.arrive(
            next(self.batches), TaskBatch(self.clock.now_s(), count, shape, minutes * 60)
        )

    @rule(rounds=st.integers(1, 30))
    def time_passes(self, rounds: int) -> None:
        self._run(self._rounds(rounds))

    @rule(rate=st.sampled_from([0.0, 0.3, 1.0]))
    def launch_failure_rate(self, rate: float) -> None:
        self.cloud._b = CloudBehaviour(
            launch_delay_s=20, boot_delay_s=10, failure_rate=rate, seed=3
        )

    @rule(on=st.booleans())
    def cloud_outage(self, on: bool) -> None:
        self.cloud.outage = on

    @rule(data=st.data())
    def cloud_instance_lost(self, data: st.DataObject) -> None:
        workers = sorted(c for c, i in self.cloud.instances.items() if i.request_id != "head")
        if workers:
            cid = data.draw(st.sampled_from(workers))
            del self.cloud.instances[cid]

    @rule(data=st.data())
    def raylet_dies(self, data: st.DataObject) -> None:
        alive = sorted(
            n for n, node in self.ray.nodes.items() if not node.dead and not node.is_head
        )
        if alive:
            node = self.ray.nodes[data.draw(st.sampled_from(alive))]
            node.dead = True
            self.ray.changes += 1

    @rule(node_type=st.sampled_from(["cpu4", "gpu"]))
    def stray_cloud_instance_appears(self, node_type: str) -> None:
        """One launched by an autoscaler that crashed before it recorded it (ray#54353)."""
        cid = f"stray-{next(self.ids)}"
        self.cloud.instances[cid] = SimInstance(
            cid, node_type, NodeKind.WORKER, "lost-request", self.clock.now_s() + 1
        )

    @rule()
    def autoscaler_restarts(self) -> None:
        self._build_autoscaler()

    # -- invariants ---------------------------------------------------------------------
    @invariant()
    def histories_follow_the_table(self) -> None:
        for inst in self.storage.rows.values():
            path = [h.status for h in inst.history]
            for old, new in itertools.pairwise(path):
                assert new in VALID_TRANSITIONS[old], (inst.instance_id, path)

    @invariant()
    def nothing_terminated_with_work_on_it(self) -> None:
        assert self.cloud.violations == []

    @invariant()
    def no_leaked_cloud_instances(self) -> None:
        """A cloud instance that existed at the last complete round is owned by a live
        instance (adopted if nobody launched it through the instance manager)."""
        owned = {
            i.cloud_instance_id
            for i in self.storage.rows.values()
            if i.status not in TERMINAL_STATUSES and i.cloud_instance_id
        }
        for cid, inst in self.cloud.instances.items():
            if inst.exists_at_s <= self.last_ok_round_at:
                assert cid in owned, f"leaked {cid}"

    @invariant()
    def every_launch_accounted_for(self) -> None:
        """Every cloud instance ever launched is tracked by an instance (live or not)."""
        tracked = {i.cloud_instance_id for i in self.storage.rows.values()}
        for cid in self.cloud.ever_launched:
            inst = self.cloud.instances.get(cid)
            if inst is not None and inst.exists_at_s <= self.last_ok_round_at:
                assert cid in tracked, f"launched {cid} is not tracked"


TestReconcilerStateMachine = ReconcilerMachine.TestCase
TestReconcilerStateMachine.settings = settings(
    max_examples=50, stateful_step_count=30, deadline=None
)
