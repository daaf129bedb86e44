"""A recording fake cloud provider and a fake GCS port for autoscaler tests.

:class:`FakeCloudProvider` follows the provider contract (idempotent per request id, errors
reported through ``poll_errors``) and can be told to fail, hang or cap capacity, Karpenter
fake-provider style.  Launched instances appear at once unless ``launch_delay_s`` is set
(then after that much time on the injected clock).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from gcs.autoscaler.gcs_api import DrainResult, VcSnapshot, VcUpdate
from gcs.autoscaler.providers.base import (
    Capabilities,
    CloudInstance,
    LaunchNodeError,
    ProviderError,
    TerminateNodeError,
)
from gcs.base.clock import Clock
from gcs.base.errors import Unavailable
from gcs.policy.autoscaling.model import NodeKind
from gcs.proto import autoscaler_pb2


@dataclass
class _Pending:
    ready_at_s: float
    instance: CloudInstance


class FakeCloudProvider:
    def __init__(
        self,
        clock: Clock,
        *,
        launch_delay_s: float = 0.0,
        node_types: Collection[str] | None = None,
    ) -> None:
        """``node_types``: the types it can launch (a launch of another one is a
        LaunchNodeError); None launches any."""
        self._clock = clock
        self.node_types = None if node_types is None else frozenset(node_types)
        self._ids = itertools.count(1)
        self.launch_delay_s = launch_delay_s
        self.instances: dict[str, CloudInstance] = {}
        self._pending: list[_Pending] = []
        self.launch_calls: list[tuple[dict[str, int], str]] = []
        self.terminate_calls: list[tuple[list[str], str]] = []
        self._seen_launch: set[str] = set()
        self._seen_terminate: set[str] = set()
        self._errors: list[ProviderError] = []
        self.next_launch_error: str | None = None
        self.notices: list[str] = []
        """Lines the provider says in words next round (``Capabilities.notices``)."""
        self.capabilities = Capabilities(notices=self._take_notices)
        self.next_terminate_error: str | None = None
        self.raise_on_list: Exception | None = None
        self.hang_next_launch = False
        self.capacity: dict[str, int] = {}
        """node type -> most instances that may exist (missing: unlimited)."""

    def _take_notices(self) -> list[str]:
        lines, self.notices = self.notices, []
        return lines

    def add(self, cloud_id: str, node_type: str, kind: NodeKind = NodeKind.WORKER) -> None:
        self.instances[cloud_id] = CloudInstance(cloud_id, node_type, kind, True)

    async def get_non_terminated(self) -> Mapping[str, CloudInstance]:
        if self.raise_on_list is not None:
            err, self.raise_on_list = self.raise_on_list, None
            raise err
        now = self._clock.now_s()
        for p in [p for p in self._pending if p.ready_at_s <= now]:
            self._pending.remove(p)
            self.instances[p.instance.cloud_instance_id] = p.instance
        return dict(self.instances)

    async def launch(self, shape: Mapping[str, int], request_id: str) -> None:
        self.launch_calls.append((dict(shape), request_id))
        if self.hang_next_launch:
            self.hang_next_launch = False
            await asyncio.Event().wait()
        if request_id in self._seen_launch:
            return
        self._seen_launch.add(request_id)
        now = self._clock.now_s()
        for node_type, count in shape.items():
            if self.node_types is not None and node_type not in self.node_types:
                self._errors.append(
                    LaunchNodeError(
                        node_type, count, request_id, int(now * 1e9), "unknown node type"
                    )
                )
                continue
            if self.next_launch_error is not None:
                msg, self.next_launch_error = self.next_launch_error, None
                self._errors.append(
                    LaunchNodeError(node_type, count, request_id, int(now * 1e9), msg)
                )
                continue
            cap = self.capacity.get(node_type)
            existing = sum(1 for i in self.instances.values() if i.node_type == node_type)
            existing += sum(1 for p in self._pending if p.instance.node_type == node_type)
            allowed = count if cap is None else max(0, min(count, cap - existing))
            if allowed < count:
                self._errors.append(
                    LaunchNodeError(
                        node_type, count - allowed, request_id, int(now * 1e9), "out of capacity"
                    )
                )
            for _ in range(allowed):
                cid = f"cloud-{next(self._ids)}"
                inst = CloudInstance(cid, node_type, NodeKind.WORKER, True, request_id)
                self._pending.append(_Pending(now + self.launch_delay_s, inst))
        await self.get_non_terminated()

    async def terminate(self, cloud_instance_ids: Sequence[str], request_id: str) -> None:
        self.terminate_calls.append((list(cloud_instance_ids), request_id))
        if request_id in self._seen_terminate:
            return
        self._seen_terminate.add(request_id)
        now = int(self._clock.now_s() * 1e9)
        for cid in cloud_instance_ids:
            if self.next_terminate_error is not None:
                msg, self.next_terminate_error = self.next_terminate_error, None
                self._errors.append(TerminateNodeError(cid, request_id, now, msg))
                continue
            self.instances.pop(cid, None)

    def poll_errors(self) -> list[ProviderError]:
        errors, self._errors = self._errors, []
        return errors


@dataclass
class FakeAutoscalerGcs:
    """Returns ``state``; records reports and drains; ``busy`` nodes reject idle drains;
    keeps InternalKV in ``kv``.  ``unavailable`` makes every read raise Unavailable."""

    state: autoscaler_pb2.ClusterResourceState = field(
        default_factory=autoscaler_pb2.ClusterResourceState
    )
    busy: set[str] = field(default_factory=set)
    reports: list[autoscaler_pb2.AutoscalingState] = field(default_factory=list)
    drains: list[str] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    releases: list[tuple[str, list[str]]] = field(default_factory=list)
    updates: list[tuple[str, dict[str, int], int]] = field(default_factory=list)
    #: The next this-many CreateOrUpdate calls find a newer revision (a concurrent writer).
    expire_next: int = 0
    kv: dict[tuple[bytes, bytes], bytes] = field(default_factory=dict)
    unavailable: bool = False

    async def get_cluster_resource_state(self) -> autoscaler_pb2.ClusterResourceState:
        if self.unavailable:
            raise Unavailable("GetClusterResourceState failed: UNAVAILABLE (fake)")
        return self.state

    async def get(self, namespace: bytes, key: bytes) -> bytes | None:
        return self.kv.get((namespace, key))

    async def put(self, namespace: bytes, key: bytes, value: bytes) -> None:
        self.kv[(namespace, key)] = value

    async def resize_raylet(
        self, node_id_hex: str, resources: Mapping[str, float]
    ) -> Mapping[str, float]:
        raise Unavailable("ResizeRayletResourceInstances: not served by this fake")

    async def live_drivers(self) -> int:
        return 0

    async def report_autoscaling_state(self, state: autoscaler_pb2.AutoscalingState) -> None:
        self.reports.append(state)

    async def drain_idle(self, node_id_hex: str, message: str) -> DrainResult:
        self.drains.append(node_id_hex)
        if node_id_hex in self.busy:
            return DrainResult(False, "The node has running work")
        return DrainResult(True)

    async def stop_node(self, node_id_hex: str) -> bool:
        self.stops.append(node_id_hex)
        return True

    async def release_nodes(self, cluster_id: str, node_ids_hex: list[str]) -> None:
        self.releases.append((cluster_id, list(node_ids_hex)))
        vc = self.state.virtual_cluster_states.get(cluster_id)
        if vc is not None:
            kept = [n for n in vc.nodes if n not in node_ids_hex]
            del vc.nodes[:]
            vc.nodes.extend(kept)
            primary = self.state.virtual_cluster_states.get("kPrimaryClusterID")
            if primary is not None:
                primary.nodes.extend(node_ids_hex)

    def _types(self) -> dict[str, str]:
        return {ns.node_id.hex(): ns.ray_node_type_name for ns in self.state.node_states}

    async def read_virtual_cluster(self, cluster_id: str) -> VcSnapshot | None:
        vc = self.state.virtual_cluster_states.get(cluster_id)
        if vc is None:
            return None
        types = self._types()
        return VcSnapshot(
            vc.revision,
            vc.divisible,
            dict(Counter(types.get(n, "") for n in vc.nodes)),
            frozenset(vc.nodes),
        )

    async def update_virtual_cluster(
        self, cluster_id: str, *, divisible: bool, replica_sets: Mapping[str, int], revision: int
    ) -> VcUpdate:
        """Grows only (what the autoscaler asks): lowest-id primary nodes of each type."""
        self.updates.append((cluster_id, dict(replica_sets), revision))
        vc = self.state.virtual_cluster_states[cluster_id]
        if self.expire_next > 0:
            self.expire_next -= 1
            vc.revision += 1
        if revision != vc.revision:
            return VcUpdate(False, expired=True, message=f"The revision ({revision}) is expired")
        types = self._types()
        primary = self.state.virtual_cluster_states["kPrimaryClusterID"]
        have = Counter(types.get(n, "") for n in vc.nodes)
        moving = []
        for node_type, want in replica_sets.items():
            spare = sorted(n for n in primary.nodes if types.get(n) == node_type)
            need = want - have[node_type]
            if need > len(spare):
                return VcUpdate(False, message="No enough nodes to add to the virtual cluster")
            moving += spare[: max(0, need)]
        kept = [n for n in primary.nodes if n not in moving]
        del primary.nodes[:]
        primary.nodes.extend(kept)
        vc.nodes.extend(moving)
        vc.revision += 1
        return VcUpdate(True, nodes=frozenset(vc.nodes))
