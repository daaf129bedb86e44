"""``ray.rpc.autoscaler.AutoscalerStateService`` state: snapshot, constraint, reports, drain.

Ray's semantics (``GcsAutoscalerStateManager``) with three deliberate differences, all so
that nothing a client was told is lost: the resource-state version never goes back across
restarts, and the ``request_resources`` constraint and the last autoscaling state are
persisted.

The snapshot is assembled from cached serialized parts (see :mod:`gcs.base.protowire`):
per-node static bytes are rebuilt only when that node's report changes, the pending-demand
section only when some node's load changed.

The constraint and the autoscaling state change on the manager's
:class:`~gcs.managers.lane.ApplyLane` (the version check of a report is made under it, so of
two concurrent reports the higher version wins); snapshot reads never take it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from gcs.base.background import race
from gcs.base.clock import Clock, within
from gcs.base.errors import InvalidArgument, NotFound, RayletUnreachable
from gcs.base.protowire import (
    LEN,
    VARINT,
    VARINT_TABLE,
    VARINT_TABLE_SIZE,
    DoubleMapEncoder,
    int_field,
    len_field,
    len_field_parts,
    string_field,
    tag,
    varint,
)
from gcs.managers.counters import DurableCounter
from gcs.managers.events import Prepared
from gcs.managers.kv import KvManager
from gcs.managers.lane import ApplyLane, ResolvePolicy
from gcs.managers.nodes import DrainRecord, NodeManager
from gcs.managers.placement_groups import PlacementGroupManager
from gcs.managers.resources import NodeResources, ResourceCache
from gcs.proto import autoscaler_pb2, gcs_pb2, node_manager_pb2
from gcs.rpc.raylet_io.gateway import RayletGateway, raylet_address
from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_META

log = structlog.get_logger("gcs.autoscaler_state")

NodeStatus = autoscaler_pb2.NodeStatus
_KEY_CONSTRAINT = b"cluster_resource_constraint"
_KEY_AUTOSCALING_STATE = b"autoscaling_state"
VERSION_COUNTER = "cluster_resource_state_version"
_STATUS_RUNNING = int_field(8, NodeStatus.RUNNING)
_STATUS_IDLE = int_field(8, NodeStatus.IDLE)
_STATUS_DRAINING = int_field(8, NodeStatus.DRAINING)
_IDLE_TAG = tag(9, VARINT)  # NodeState.idle_duration_ms
_NODE_STATE_TAG = tag(3, LEN)  # ClusterResourceState.node_states


@dataclass(slots=True)
class _NodeBytes:
    generation: int
    node_info: gcs_pb2.GcsNodeInfo
    static: bytes
    info: bytes


class AutoscalerStateManager:
    def __init__(
        self,
        store: Store,
        kv: KvManager,
        clock: Clock,
        nodes: NodeManager,
        resources: ResourceCache,
        placement_groups: PlacementGroupManager,
        raylets: RayletGateway,
        *,
        session_name: Callable[[], str] = lambda: "",
        raylet_timeout_s: float = 30.0,
        virtual_cluster_section: Callable[[], bytes] | None = None,
        lane_policy: ResolvePolicy | None = None,
    ) -> None:
        """``session_name``: read when a snapshot is built (the cluster identity is loaded
        after construction)."""
        self._store = store
        self._drained_away: dict[bytes, list[asyncio.Future[None]]] = {}
        self._kv = kv
        self._clock = clock
        self._nodes = nodes
        self._resources = resources
        self._pgs = placement_groups
        self._raylets = raylets
        self._session_name = session_name
        self._raylet_timeout_s = raylet_timeout_s
        self._lane = ApplyLane(store, "autoscaler_state", clock, policy=lane_policy)
        self.version = DurableCounter(store, VERSION_COUNTER)
        self.constraint: autoscaler_pb2.ClusterResourceConstraint | None = None
        self.autoscaling_state: autoscaler_pb2.AutoscalingState | None = None
        self._autoscaling_state_field = b""
        """``autoscaling_state`` as GetClusterStatusReply's field 1 (empty: none reported)."""
        self._node_bytes: dict[bytes, _NodeBytes] = {}
        self._dead_bytes: dict[bytes, bytes] = {}
        self._pg_version = -1
        self._maps = DoubleMapEncoder()
        self._pg_sections: tuple[dict[bytes, list[bytes]], bytes] = ({}, b"")
        self._virtual_cluster_section = virtual_cluster_section
        """Serialized ``virtual_cluster_states`` (field 8) entries (the VC manager's)."""

    async def load(self) -> None:
        await self.version.load()
        raw = await self._store.get(TABLE_META, _KEY_CONSTRAINT)
        if raw is not None:
            self.constraint = autoscaler_pb2.ClusterResourceConstraint.FromString(raw)
        raw = await self._store.get(TABLE_META, _KEY_AUTOSCALING_STATE)
        if raw is not None:
            self.autoscaling_state = autoscaler_pb2.AutoscalingState.FromString(raw)
            self._autoscaling_state_field = len_field(1, raw)

    # -- GetClusterResourceState / GetClusterStatus ----------------------------------------
    async def cluster_resource_state_bytes(self, last_seen_version: int = 0) -> bytes:
        """Serialized ``ClusterResourceState`` with a fresh version (``last_seen_version``
        validated >= 0 by the servicer; being ahead of ours depends on state, checked here)."""
        if last_seen_version > self.version.current:
            raise InvalidArgument(
                "last_seen_cluster_resource_state_version "
                f"{last_seen_version} is ahead of the GCS's version {self.version.current}"
            )
        version = await self.version.next()
        return self._build(version)

    async def cluster_resource_state(self) -> autoscaler_pb2.ClusterResourceState:
        return autoscaler_pb2.ClusterResourceState.FromString(
            await self.cluster_resource_state_bytes()
        )

    def _build(self, version: int) -> bytes:
        now_mono = self._clock.monotonic_s()
        parts = [int_field(1, version)]
        pg_labels, gang_bytes = self._placement_group_sections()
        version_bytes = int_field(7, version)
        running = version_bytes + _STATUS_RUNNING
        draining = version_bytes + _STATUS_DRAINING
        idle_prefix = version_bytes + _STATUS_IDLE + _IDLE_TAG
        resource_nodes = self._resources.nodes
        node_bytes = self._node_bytes
        extend = parts.extend
        lengths, short = VARINT_TABLE, VARINT_TABLE_SIZE
        # The hot loop (2,000+ nodes per read): inlined, no per-node calls on the common path.
        for node_id, node in self._nodes.alive.items():
            entry = resource_nodes.get(node_id)
            cached = node_bytes.get(node_id)
            if (
                entry is None
                or cached is None
                or cached.generation != entry.generation
                or cached.node_info is not node
            ):
                cached = self._rebuild_node(node_id, node, entry)
            if entry is None:
                dynamic = running
            else:
                data = entry.data
                if data.is_draining:
                    dynamic = draining
                elif (idle_ms := data.idle_duration_ms) > 0:
                    idle = idle_ms + int((now_mono - entry.updated_mono_s) * 1000)
                    dynamic = idle_prefix + varint(idle)
                else:
                    dynamic = running
            if pg_labels and (pgs := pg_labels.get(node_id)):
                for pg_id in pgs:
                    dynamic += len_field(6, len_field(1, f"_PG_{pg_id.hex()}".encode()))
            static = cached.static
            size = len(static) + len(dynamic)
            extend(
                (_NODE_STATE_TAG, lengths[size] if size < short else varint(size), static, dynamic)
            )
        for node_id, node in self._nodes.dead.items():
            dead_static = self._dead_bytes.get(node_id)
            if dead_static is None:
                dead_static = self._dead_bytes[node_id] = autoscaler_pb2.NodeState(
                    node_id=node_id,
                    instance_id=node.instance_id,
                    ray_node_type_name=node.node_type_name,
                    node_ip_address=node.node_manager_address,
                    instance_type_name=node.instance_type_name,
                    status=NodeStatus.DEAD,
                ).SerializeToString()
            parts.extend(len_field_parts(3, dead_static, version_bytes))
        if len(self._dead_bytes) > len(self._nodes.dead) + 64:
            self._dead_bytes = {k: v for k, v in self._dead_bytes.items() if k in self._nodes.dead}
        live = self._nodes.alive
        if len(self._node_bytes) > len(live) + 64:
            self._node_bytes = {k: v for k, v in self._node_bytes.items() if k in live}
        parts.append(self._resources.demand.serialized_requests())
        parts.append(gang_bytes)
        if self.constraint is not None:
            parts.append(len_field(6, self.constraint.SerializeToString()))
        parts.append(string_field(7, self._session_name()))
        if self._virtual_cluster_section is not None:
            parts.append(self._virtual_cluster_section())
        return b"".join(parts)

    def _placement_group_sections(self) -> tuple[dict[bytes, list[bytes]], bytes]:
        """PG ids per node (``_PG_<id>`` labels) and the pending-gang bytes, rebuilt only when
        the placement-group table changed (its ``version``), not on every read."""
        if self._pg_version != self._pgs.version:
            labels: dict[bytes, list[bytes]] = {}
            for pg in self._pgs.groups.values():
                if pg.state == gcs_pb2.PlacementGroupTableData.REMOVED:
                    continue
                for bundle in pg.bundles:
                    if bundle.node_id:
                        labels.setdefault(bundle.node_id, []).append(pg.placement_group_id)
            gangs = b"".join(
                len_field(5, gang.SerializeToString()) for gang in self._pgs.gang_requests()
            )
            self._pg_sections = (labels, gangs)
            self._pg_version = self._pgs.version
        return self._pg_sections

    def _rebuild_node(
        self, node_id: bytes, node: gcs_pb2.GcsNodeInfo, entry: NodeResources | None
    ) -> _NodeBytes:
        """The node's NodeState bytes without the per-read fields (version, status, idle).

        Identity fields are serialized once per registration; the two resource maps are
        encoded by hand because they change with every report that moves resources.
        """
        cached = self._node_bytes.get(node_id)
        if cached is not None and cached.node_info is node:
            info = cached.info
        else:
            info = autoscaler_pb2.NodeState(
                node_id=node_id,
                instance_id=node.instance_id,
                ray_node_type_name=node.node_type_name,
                node_ip_address=node.node_manager_address,
                instance_type_name=node.instance_type_name,
                labels=node.labels,
                node_activity=node.state_snapshot.node_activity,
            ).SerializeToString(deterministic=True)
        if entry is not None:
            available, total = entry.data.resources_available, entry.data.resources_total
        else:
            available = total = node.resources_total
        encode = self._maps.encode
        static = info + encode(4, available) + encode(5, total)
        generation = entry.generation if entry is not None else -1
        cached = _NodeBytes(generation, node, static, info)
        self._node_bytes[node_id] = cached
        return cached

    async def cluster_status(self) -> bytes:
        """Serialized ``GetClusterStatusReply``: the state's bytes framed as they are (never
        parsed back into a message to be serialized again), the last autoscaling state."""
        state = await self.cluster_resource_state_bytes()
        return b"".join((self._autoscaling_state_field, *len_field_parts(2, state)))

    # -- constraint / reports --------------------------------------------------------------
    async def set_constraint(self, constraint: autoscaler_pb2.ClusterResourceConstraint) -> None:
        """A validated constraint (the servicer checked counts and resource maps)."""
        stored = autoscaler_pb2.ClusterResourceConstraint()
        stored.CopyFrom(constraint)

        def apply() -> None:
            self.constraint = stored

        async with self._lane:
            batch = WriteBatch().put(TABLE_META, _KEY_CONSTRAINT, stored.SerializeToString())
            await self._lane.commit(batch, apply)

    async def report_autoscaling_state(self, state: autoscaler_pb2.AutoscalingState) -> bool:
        """Keep the newest report; an older ``autoscaler_state_version`` is ignored (False),
        as Ray does.  The check is made on the lane, against the state a concurrent report
        may just have applied."""
        stored = autoscaler_pb2.AutoscalingState()
        stored.CopyFrom(state)
        async with self._lane:
            current = self.autoscaling_state
            if (
                current is not None
                and stored.autoscaler_state_version < current.autoscaler_state_version
            ):
                log.info(
                    "autoscaling_state.stale",
                    got=stored.autoscaler_state_version,
                    have=current.autoscaler_state_version,
                )
                return False

            wire = stored.SerializeToString()

            def apply() -> None:
                self.autoscaling_state = stored
                self._autoscaling_state_field = len_field(1, wire)

            batch = WriteBatch().put(TABLE_META, _KEY_AUTOSCALING_STATE, wire)
            await self._lane.commit(batch, apply)
            return True

    async def report_cluster_config(self, config: autoscaler_pb2.ClusterConfig) -> None:
        await self._kv.put(
            b"__autoscaler",
            b"__autoscaler_cluster_config",
            config.SerializeToString(),
            overwrite=True,
        )

    # -- forwarding to raylets -------------------------------------------------------------
    async def drain_node(
        self, request: autoscaler_pb2.DrainNodeRequest
    ) -> autoscaler_pb2.DrainNodeReply:
        """A validated request (the servicer checked its fields)."""
        node = self._nodes.alive.get(request.node_id)
        if node is None:
            return autoscaler_pb2.DrainNodeReply(is_accepted=True)
        reply = await self._drain_raylet(
            request.node_id,
            raylet_address(node),
            node_manager_pb2.DrainRayletRequest(
                reason=request.reason,
                reason_message=request.reason_message,
                deadline_timestamp_ms=request.deadline_timestamp_ms,
            ),
        )
        out = autoscaler_pb2.DrainNodeReply(is_accepted=reply.is_accepted)
        if reply.is_accepted:
            self._nodes.record_drain(
                request.node_id,
                DrainRecord(request.reason, request.reason_message, request.deadline_timestamp_ms),
            )
        else:
            out.rejection_reason_message = reply.rejection_reason_message
        return out

    async def _drain_raylet(
        self, node_id: bytes, address: str, request: node_manager_pb2.DrainRayletRequest
    ) -> node_manager_pb2.DrainRayletReply:
        """DrainRaylet, answered by whichever comes first:

        * the raylet's reply;
        * the node's death, for any reason (accepted, as Ray answers a drain of a node that
          is not alive): a raylet that accepts an idle drain unregisters itself and exits,
          and its reply can be lost with the process; a node that unregistered or died
          otherwise needs no drain, and its connections are being closed under the call;
        * the raylet timeout on this manager's clock (``RayletUnreachable``).

        So a drain never outlives its raylet timeout, and never waits for a node that is
        gone (three drains of a silent raylet waited for the caller's own deadline when the
        node unregistered meanwhile)."""
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drained_away.setdefault(node_id, []).append(gone)
        drain = self._raylets.drain(node_id, address, request, self._raylet_timeout_s)
        call: asyncio.Future[node_manager_pb2.DrainRayletReply] | None = None
        try:
            with contextlib.suppress(TimeoutError):
                call, _ = await within(
                    self._clock, self._raylet_timeout_s, race(drain, asyncio.shield(gone))
                )
            if call is not None and call.cancelled():
                call = None  # the node went first
            if call is not None and call.exception() is None:
                return call.result()
            if gone.done() or node_id not in self._nodes.alive:
                log.info("autoscaler_state.drained_away", node_id=node_id.hex())
                return node_manager_pb2.DrainRayletReply(is_accepted=True)
            if call is not None:
                return call.result()  # raises the call's error
            raise RayletUnreachable(
                node_id,
                f"raylet {node_id.hex()} DrainRaylet: no answer within "
                f"{self._raylet_timeout_s:g} s",
            )
        finally:
            waiters = self._drained_away.get(node_id, [])
            if gone in waiters:
                waiters.remove(gone)
            if not waiters:
                self._drained_away.pop(node_id, None)

    def drains_waiting(self, node_id: bytes) -> int:
        """DrainNode calls for ``node_id`` waiting on its raylet now."""
        return len(self._drained_away.get(node_id, ()))

    # -- NodeListener ------------------------------------------------------------------------

    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
        pass

    def on_nodes_loaded(
        self, nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo], prepared: Prepared
    ) -> None:
        return None

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        for gone in self._drained_away.get(node.node_id, []):
            if not gone.done():
                gone.set_result(None)

    async def resize(
        self, request: autoscaler_pb2.ResizeRayletResourceInstancesRequest
    ) -> autoscaler_pb2.ResizeRayletResourceInstancesReply:
        node = self._nodes.alive.get(request.node_id)
        if node is None:
            raise NotFound(f"Raylet {request.node_id.hex()} is not alive.")
        totals = await self._raylets.resize(
            request.node_id, raylet_address(node), request.resources, self._raylet_timeout_s
        )
        self._resources.apply_resize(request.node_id, totals)
        return autoscaler_pb2.ResizeRayletResourceInstancesReply(total_resources=totals)
