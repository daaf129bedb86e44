"""Randomized state machine over the real reconciler in the simulated world.

Rules: task arrivals, time passing, provider failures and outages, lost cloud instances,
raylet deaths, and autoscaler restarts (a new instance manager and reconciler on the same
storage).  Invariants after every step:
- every stored instance's history follows the lifecycle table;
- no cloud instance leaks: each one is owned by a live instance within a round of appearing;
- no instance is terminated while its Ray node is alive with work on it;
- every launch is accounted for: each cloud instance ever launched is owned by an instance
  or was terminated;
- with a virtual cluster ``vc1`` (indivisible, its min/max config and revision changed by
  rules): no node it holds is terminated, the autoscaler never grows it past its max, never
  releases it below its min, and never writes with a stale revision that succeeds.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Mapping

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gcs.autoscaler.config import parse_cluster_config
from gcs.autoscaler.gcs_api import VcSnapshot, VcUpdate
from gcs.autoscaler.instances import InstanceManager, MemoryInstanceStorage
from gcs.autoscaler.instances.transitions import TERMINAL_STATUSES, VALID_TRANSITIONS
from gcs.autoscaler.reconciler import (
    CloudInstanceUpdater,
    EventLog,
    RayStopper,
    ReconcileConfig,
    Reconciler,
)
from gcs.autoscaler.simulator.workload import CloudBehaviour, TaskBatch
from gcs.autoscaler.simulator.world import SimCloud, SimInstance, SimRay
from gcs.base.clock import FakeClock
from gcs.policy.autoscaling.model import NodeKind
from gcs.policy.virtual_clusters import PRIMARY_CLUSTER_ID
from gcs.proto import autoscaler_pb2

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
        held = getattr(self.ray, "vc", set())
        for node_id in held:
            node = self.ray.nodes.get(node_id)
            if node is not None and not node.dead and node.cloud_id in cloud_instance_ids:
                self.violations.append(f"terminated {node.cloud_id} while vc1 holds it")


class VcRay(SimRay):
    """The simulated Ray cluster plus one indivisible virtual cluster ``vc1`` that behaves
    as the GCS's does toward the autoscaler (grow by replica sets at the current revision,
    all-or-nothing release of idle nodes), and records any breach of its config."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.vc: set[bytes] = set()
        self.revision = 1
        self.min: dict[str, int] = {"cpu4": 1}
        self.max: dict[str, int] = {"cpu4": 2}
        self.max_nodes = 2
        self.conflicts = 0
        self.vc_violations: list[str] = []

    def _alive(self, node_id: bytes) -> bool:
        node = self.nodes.get(node_id)
        return node is not None and not node.dead

    async def get_cluster_resource_state(self) -> autoscaler_pb2.ClusterResourceState:
        state = await super().get_cluster_resource_state()
        vc = state.virtual_cluster_states["vc1"]
        vc.revision = self.revision
        vc.nodes.extend(sorted(n.hex() for n in self.vc if self._alive(n)))
        vc.min_replica_sets.update(self.min)
        vc.max_replica_sets.update(self.max)
        vc.max_nodes = self.max_nodes
        primary = state.virtual_cluster_states[PRIMARY_CLUSTER_ID]
        primary.divisible = True
        primary.nodes.extend(
            sorted(n.hex() for n in self.nodes if n not in self.vc and self._alive(n))
        )
        return state

    def _types(self, ids: set[bytes]) -> Counter[str]:
        return Counter(self.nodes[n].node_type for n in ids if n in self.nodes)

    async def read_virtual_cluster(self, cluster_id: str) -> VcSnapshot | None:
        return VcSnapshot(
            self.revision, False, dict(self._types(self.vc)), frozenset(n.hex() for n in self.vc)
        )

    async def update_virtual_cluster(
        self, cluster_id: str, *, divisible: bool, replica_sets: Mapping[str, int], revision: int
    ) -> VcUpdate:
        if self.conflicts > 0:
            self.conflicts -= 1
            self.revision += 1  # someone else updated it first
        if revision != self.revision:
            return VcUpdate(False, expired=True, message="The revision is expired")
        have = self._types(self.vc)
        adding: set[bytes] = set()
        for node_type, want in replica_sets.items():
            if want < have[node_type]:
                self.vc_violations.append(f"autoscaler shrank vc1 {node_type} by an update")
            spare = sorted(
                n
                for n, node in self.nodes.items()
                if n not in self.vc and not node.dead and not node.is_head
                and node.node_type == node_type
            )  # fmt: skip
            need = want - have[node_type]
            if need > len(spare):
                return VcUpdate(False, message="No enough nodes to add to the virtual cluster")
            adding |= set(spare[: max(0, need)])
        alive = {n for n in self.vc | adding if self._alive(n)}
        counts = self._types(alive)
        grew = adding and (
            (self.max_nodes and len(alive) > self.max_nodes)
            or any(counts[t] > self.max.get(t, counts[t]) for t in counts)
        )
        if grew:
            self.vc_violations.append(f"vc1 grown past its max to {dict(counts)}")
        self.vc |= adding
        self.revision += 1
        self.changes += 1
        return VcUpdate(True, nodes=frozenset(n.hex() for n in self.vc))

    async def release_nodes(self, cluster_id: str, node_ids_hex: list[str]) -> None:
        ids = {bytes.fromhex(n) for n in node_ids_hex}
        if any(n not in self.vc or (self._alive(n) and self.nodes[n].running) for n in ids):
            raise RuntimeError("Failed to remove some of the nodes: not idle nor found")
        left = self._types({n for n in self.vc - ids if self._alive(n)})
        for node_type in self._types({n for n in ids if self._alive(n)}):
            least = self.min.get(node_type, 0)
            if left[node_type] < least:
                self.vc_violations.append(f"vc1 released below its min {node_type}={least}")
        self.vc -= ids
        self.changes += 1


class ReconcilerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock(start_s=0.0)
        self.behaviour = CloudBehaviour(launch_delay_s=20, boot_delay_s=10, seed=3)
        self.cloud = WatchedCloud(self.clock, self.behaviour)
        self.ray = VcRay(self.clock, CLUSTER, self.cloud, self.behaviour)
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

    @rule(
        low=st.integers(0, 2),
        extra=st.integers(0, 2),
        max_nodes=st.integers(0, 4),
        node_type=st.sampled_from(["cpu4", "gpu"]),
    )
    def vc_autoscaling_config(self, low: int, extra: int, max_nodes: int, node_type: str) -> None:
        """UpdateAutoscalingConfig's rules: min <= max, sum of mins <= max_nodes."""
        self.ray.min = {node_type: min(low, max_nodes)}
        self.ray.max = {node_type: min(low, max_nodes) + extra}
        self.ray.max_nodes = max_nodes
        self.ray.changes += 1

    @rule(data=st.data())
    def operator_moves_a_node_into_vc(self, data: st.DataObject) -> None:
        free = sorted(
            n
            for n, node in self.ray.nodes.items()
            if n not in self.ray.vc and not node.dead and not node.is_head
        )
        if free:
            self.ray.vc.add(data.draw(st.sampled_from(free)))
            self.ray.revision += 1
            self.ray.changes += 1

    @rule(n=st.integers(1, 4))
    def concurrent_vc_writers(self, n: int) -> None:
        self.ray.conflicts = n

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
    def nothing_terminated_with_work_on_it_or_held_by_a_vc(self) -> None:
        assert self.cloud.violations == []

    @invariant()
    def vc_config_honoured(self) -> None:
        assert self.ray.vc_violations == [], self.ray.vc_violations

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
