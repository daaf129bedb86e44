"""The simulated world: a cloud that launches with delays, failures and capacity limits,
Ray nodes that boot on its instances, and tasks placed on them first-fit.

It implements the two ports the real reconciler talks to (:class:`CloudProvider` and
:class:`AutoscalerGcs`), so the simulator runs the unmodified reconciler and scheduler.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.gcs_api import DrainResult, VcSnapshot, VcUpdate
from gcs.autoscaler.providers.base import (
    Capabilities,
    CloudInstance,
    LaunchErrorKind,
    LaunchNodeError,
    ProviderError,
)
from gcs.autoscaler.simulator.workload import CloudBehaviour, TaskBatch
from gcs.base.clock import FakeClock
from gcs.base.protowire import len_field
from gcs.policy.autoscaling.model import HEAD_RESOURCE, NodeKind
from gcs.proto import autoscaler_pb2

_NODE_STATES = 3  # ClusterResourceState.node_states

Shape = tuple[tuple[str, float], ...]


@dataclass
class SimInstance:
    cloud_id: str
    node_type: str
    kind: NodeKind
    request_id: str
    exists_at_s: float


@dataclass
class SimNode:
    node_id: bytes
    cloud_id: str
    node_type: str
    total: dict[str, float]
    available: dict[str, float]
    is_head: bool
    idle_since_s: float
    running: int = 0
    dead: bool = False


@dataclass(order=True)
class _Finish:
    at_s: float
    seq: int
    node_id: bytes = field(compare=False)
    shape: Shape = field(compare=False)


class SimCloud:
    """:class:`CloudProvider` with launch delays, random failures and capacity caps."""

    capabilities = Capabilities()

    def __init__(self, clock: FakeClock, behaviour: CloudBehaviour) -> None:
        self._clock = clock
        self._b = behaviour
        self._rng = random.Random(behaviour.seed)
        self._ids = itertools.count(1)
        self.instances: dict[str, SimInstance] = {}
        self._seen: set[str] = set()
        self._errors: list[ProviderError] = []
        self.launched = 0
        self.failed = 0
        self.terminated = 0
        self.failures: list[tuple[float, str, int, LaunchErrorKind]] = []
        """(time, node type, instances, why) of every failed launch, for the timeline."""

    async def get_non_terminated(self) -> Mapping[str, CloudInstance]:
        now = self._clock.now_s()
        return {
            cid: CloudInstance(cid, i.node_type, i.kind, True, i.request_id)
            for cid, i in self.instances.items()
            if i.exists_at_s <= now
        }

    def add_head(self, node_type: str) -> None:
        cid = f"sim-{next(self._ids)}"
        self.instances[cid] = SimInstance(cid, node_type, NodeKind.HEAD, "head", 0.0)

    async def launch(self, shape: Mapping[str, int], request_id: str) -> None:
        if request_id in self._seen:
            return
        self._seen.add(request_id)
        now = self._clock.now_s()
        for node_type, count in shape.items():
            cap = self._b.capacity.get(node_type)
            have = sum(1 for i in self.instances.values() if i.node_type == node_type)
            allowed = count if cap is None else max(0, min(count, cap - have))
            broken = 0
            for _ in range(allowed):
                if self._rng.random() < self._b.failure_rate:
                    broken += 1
                    continue
                cid = f"sim-{next(self._ids)}"
                self.instances[cid] = SimInstance(
                    cid, node_type, NodeKind.WORKER, request_id, now + self._b.launch_delay_s
                )
                self.launched += 1
            if count > allowed:
                why = f"capacity exhausted: all {cap} {node_type} instances of the cloud are in use"
                self._fail(node_type, count - allowed, request_id, why, LaunchErrorKind.CAPACITY)
            if broken:
                why = "launch failed (simulated)"
                self._fail(node_type, broken, request_id, why, LaunchErrorKind.ERROR)

    def _fail(
        self, node_type: str, count: int, request_id: str, why: str, kind: LaunchErrorKind
    ) -> None:
        now = self._clock.now_s()
        self.failed += count
        self.failures.append((now, node_type, count, kind))
        self._errors.append(
            LaunchNodeError(node_type, count, request_id, int(now * 1e9), why, kind)
        )

    async def terminate(self, cloud_instance_ids: Sequence[str], request_id: str) -> None:
        for cid in cloud_instance_ids:
            if self.instances.pop(cid, None) is not None:
                self.terminated += 1

    def poll_errors(self) -> list[ProviderError]:
        errors, self._errors = self._errors, []
        return errors

    def has_errors(self) -> bool:
        """Errors not yet reported: the next round sees them."""
        return bool(self._errors)

    def next_appearance(self) -> float:
        """When the next launched instance appears in the listing (inf: none pending)."""
        now = self._clock.now_s()
        return min(
            (i.exists_at_s for i in self.instances.values() if i.exists_at_s > now),
            default=math.inf,
        )


class SimRay:
    """:class:`AutoscalerGcs` over simulated Ray nodes and a first-fit task queue."""

    def __init__(
        self, clock: FakeClock, cluster: ClusterConfig, cloud: SimCloud, behaviour: CloudBehaviour
    ) -> None:
        self._clock = clock
        self._cluster = cluster
        self._cloud = cloud
        self._boot_s = behaviour.boot_delay_s
        self.nodes: dict[bytes, SimNode] = {}
        self._by_cloud: dict[str, bytes] = {}
        self.pending: dict[Shape, deque[tuple[float, int]]] = {}
        """shape -> FIFO of (arrival time, batch index)."""
        self._finishes: list[_Finish] = []
        self._seq = itertools.count()
        self.version = 0
        self._state_bytes: dict[bytes, tuple[tuple, bytes]] = {}
        self.changes = 0
        """Counts every change of the world (lets the runner skip provably quiet rounds)."""
        self.finishes = 0
        """The part of ``changes`` that are tasks finishing (capacity freed, nothing else)."""
        self.last_report: autoscaler_pb2.AutoscalingState | None = None
        self.wait_s_total = 0.0
        self.started = 0
        self.batch_left: dict[int, int] = {}
        self.batch_done_at: dict[int, float] = {}
        self.batch_arrival: dict[int, float] = {}
        self._durations: dict[int, float] = {}

    # -- world dynamics --------------------------------------------------------------------
    def arrive(self, index: int, batch: TaskBatch) -> None:
        shape: Shape = tuple(sorted(batch.resources.items()))
        q = self.pending.setdefault(shape, deque())
        q.extend([(batch.at_s, index)] * batch.count)
        self.changes += 1
        self.batch_left[index] = batch.count
        self.batch_arrival[index] = batch.at_s
        self._durations[index] = batch.duration_s
        if batch.count == 0:
            self.batch_done_at[index] = batch.at_s

    def step(self, now: float) -> None:
        self._finish(now)
        self._boot_and_reap(now)
        self._place(now)
        self.version += 1

    def _finish(self, now: float) -> None:
        while self._finishes and self._finishes[0].at_s <= now:
            f = heapq.heappop(self._finishes)
            node = self.nodes.get(f.node_id)
            if node is None or node.dead:
                continue
            for k, v in f.shape:
                node.available[k] = node.available.get(k, 0.0) + v
            node.running -= 1
            self.changes += 1
            self.finishes += 1
            if node.running == 0:
                node.idle_since_s = f.at_s

    def _boot_and_reap(self, now: float) -> None:
        live = self._cloud.instances
        for cid, inst in live.items():
            if cid in self._by_cloud or inst.exists_at_s + self._boot_s > now:
                continue
            cfg = self._cluster.scheduler.node_types.get(inst.node_type)
            total = dict(cfg.resources) if cfg else {}
            is_head = inst.kind is NodeKind.HEAD
            if is_head:
                total[HEAD_RESOURCE] = 1.0
            node_id = hashlib.sha1(cid.encode()).digest()[:28]
            self.nodes[node_id] = SimNode(
                node_id, cid, inst.node_type, total, dict(total), is_head, now
            )
            self._by_cloud[cid] = node_id
            self.changes += 1
        for cid, node_id in list(self._by_cloud.items()):
            if cid not in live:
                # tasks on it are lost (no retries): their batch never completes
                self.nodes.pop(node_id, None)
                del self._by_cloud[cid]
                self.changes += 1

    def _place(self, now: float) -> None:
        nodes = [n for n in self.nodes.values() if not n.dead]
        for shape, queue in self.pending.items():
            if not queue:
                continue
            for node in nodes:
                while queue and all(node.available.get(k, 0.0) >= v - 1e-9 for k, v in shape):
                    arrived, index = queue.popleft()
                    for k, v in shape:
                        node.available[k] -= v
                    node.running += 1
                    self.changes += 1
                    self.wait_s_total += now - arrived
                    self.started += 1
                    heapq.heappush(
                        self._finishes,
                        _Finish(now + self._durations[index], next(self._seq), node.node_id, shape),
                    )
                    self.batch_left[index] -= 1
                    if self.batch_left[index] == 0:
                        self.batch_done_at[index] = now
                if not queue:
                    break

    def pending_count(self) -> int:
        return sum(len(q) for q in self.pending.values())

    def pending_demand(self) -> dict[str, float]:
        """Resources the waiting tasks ask for, summed per resource kind."""
        out: dict[str, float] = {}
        for shape, queue in self.pending.items():
            for name, amount in shape:
                out[name] = out.get(name, 0.0) + amount * len(queue)
        return out

    # -- AutoscalerGcs ----------------------------------------------------------------------
    async def get_cluster_resource_state(self) -> autoscaler_pb2.ClusterResourceState:
        """The state as a GCS would send it; each node's bytes are kept until it changes
        (building 500 NodeState messages a round was a tenth of a simulated round)."""
        now = self._clock.now_s()
        head = autoscaler_pb2.ClusterResourceState(cluster_resource_state_version=self.version)
        for shape, queue in self.pending.items():
            if queue:
                head.pending_resource_requests.add(
                    request=autoscaler_pb2.ResourceRequest(resources_bundle=dict(shape)),
                    count=len(queue),
                )
        parts = [head.SerializeToString()]
        cache: dict[bytes, tuple[tuple, bytes]] = {}
        for node in self.nodes.values():
            idle = node.running == 0
            status = (
                autoscaler_pb2.DEAD
                if node.dead
                else (autoscaler_pb2.IDLE if idle else autoscaler_pb2.RUNNING)
            )
            idle_ms = int((now - node.idle_since_s) * 1000) if idle else 0
            key = (status, idle_ms, tuple(node.available.items()), tuple(node.total.items()))
            hit = self._state_bytes.get(node.node_id)
            if hit is None or hit[0] != key:
                raw = autoscaler_pb2.NodeState(
                    node_id=node.node_id,
                    instance_id=node.cloud_id,
                    ray_node_type_name=node.node_type,
                    total_resources=node.total,
                    available_resources=node.available,
                    status=status,
                    idle_duration_ms=idle_ms,
                ).SerializeToString()
                hit = (key, len_field(_NODE_STATES, raw))
            cache[node.node_id] = hit
            parts.append(hit[1])
        self._state_bytes = cache
        return autoscaler_pb2.ClusterResourceState.FromString(b"".join(parts))

    async def report_autoscaling_state(self, state: autoscaler_pb2.AutoscalingState) -> None:
        self.last_report = state

    async def drain_idle(self, node_id_hex: str, message: str) -> DrainResult:
        node = self.nodes.get(bytes.fromhex(node_id_hex))
        if node is None or node.dead:
            return DrainResult(True)
        if node.running:
            return DrainResult(False, "The node has running tasks")
        node.dead = True  # an idle-drained raylet exits at once
        self.changes += 1
        return DrainResult(True)

    async def release_nodes(self, cluster_id: str, node_ids_hex: list[str]) -> None:
        return None  # the simulator has no virtual clusters

    async def read_virtual_cluster(self, cluster_id: str) -> VcSnapshot | None:
        return None

    async def update_virtual_cluster(
        self, cluster_id: str, *, divisible: bool, replica_sets: Mapping[str, int], revision: int
    ) -> VcUpdate:
        return VcUpdate(False, message="the simulator has no virtual clusters")

    async def stop_node(self, node_id_hex: str) -> bool:
        node = self.nodes.get(bytes.fromhex(node_id_hex))
        if node is None:
            return False
        node.dead = True
        node.running = 0
        self.changes += 1
        return True
