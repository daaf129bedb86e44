"""Node registry (``GcsNodeManager``): alive and dead nodes, death, and who hears of it.

Write path, on the manager's :class:`~gcs.managers.lane.ApplyLane`: validate -> persist the
NODE row -> apply in memory -> notify listeners (:class:`~gcs.managers.events.NodeEvents`)
-> publish (node info + address/liveness channels) -> reply.  Registration, graceful exit,
legacy drain and health-check death all take the lane, so concurrent calls about one node
are applied one after the other against current state (a second death is a no-op, as in
Ray).  Dead nodes stay in the table and in a bounded cache (Ray:
``maximum_gcs_dead_node_cached_count``); evicted ones are deleted.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import structlog
from google.protobuf.message import Message

from gcs.base.clock import Clock, now_ms
from gcs.base.errors import FailedPrecondition
from gcs.base.ids import NIL_JOB_ID
from gcs.managers.events import NodeEvents, NodeListener
from gcs.managers.lane import ApplyLane, ResolvePolicy
from gcs.proto import autoscaler_pb2, common_pb2, gcs_pb2, pubsub_pb2
from gcs.store import Store, WriteBatch
from gcs.store.base import TABLE_NODE

__all__ = ["DrainRecord", "NodeListener", "NodeManager", "address_and_liveness"]

log = structlog.get_logger("gcs.nodes")

ALIVE = gcs_pb2.GcsNodeInfo.ALIVE
DEAD = gcs_pb2.GcsNodeInfo.DEAD
Reason = common_pb2.NodeDeathInfo.Reason
HEALTH_CHECK_DEATH_MESSAGE = "health check failed due to missing too many heartbeats"
NODE_REMOVED_ERROR = "node_removed"
"""``ErrorTableData.type`` of the warning on a node's unexpected death (Ray's
``ray_constants.REMOVED_NODE_ERROR``)."""


def node_removed_error(node: gcs_pb2.GcsNodeInfo, timestamp_ms: int) -> gcs_pb2.ErrorTableData:
    """What Ray's GCS tells every driver when a node dies unexpectedly (a health-check
    death, or a raylet's own report of an unexpected end), in Ray's words: drivers print it,
    and Ray's tests read the node id as its sixth word."""
    return gcs_pb2.ErrorTableData(
        job_id=NIL_JOB_ID,
        type=NODE_REMOVED_ERROR,
        error_message=(
            f"The node with node id: {node.node_id.hex()} and address: "
            f"{node.node_manager_address} and node name: {node.node_name} has been marked "
            "dead because the detector has missed too many heartbeats from it. This can "
            "happen when a \t(1) raylet crashes unexpectedly (OOM, etc.) \n"
            "\t(2) raylet has lagging heartbeats due to slow network or busy workload."
        ),
        timestamp=timestamp_ms,
    )


class Publish(Protocol):
    """``Publisher.publish``: ``message`` is the channel's payload (or a whole PubMessage)."""

    def __call__(self, channel: int, key_id: bytes, message: Message) -> object: ...


@dataclass(frozen=True, slots=True)
class DrainRecord:
    reason: int
    reason_message: str
    deadline_timestamp_ms: int


def no_publish(channel: int, key_id: bytes, message: Message) -> None:
    return None


def address_and_liveness(node: gcs_pb2.GcsNodeInfo) -> gcs_pb2.GcsNodeAddressAndLiveness:
    out = gcs_pb2.GcsNodeAddressAndLiveness(
        node_id=node.node_id,
        node_manager_address=node.node_manager_address,
        node_manager_port=node.node_manager_port,
        object_manager_port=node.object_manager_port,
        state=node.state,
    )
    if node.HasField("death_info"):
        out.death_info.CopyFrom(node.death_info)
    return out


class NodeManager:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        events: NodeEvents | None = None,
        publish: Publish = no_publish,
        publish_error: Publish = no_publish,
        max_dead_cached: int = 1000,
        lane_policy: ResolvePolicy | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._events = events if events is not None else NodeEvents()
        self._publish = publish
        self._publish_error = publish_error
        """The observability publisher (``RAY_ERROR_INFO``): warnings for drivers."""
        self._max_dead = max_dead_cached
        self._lane = ApplyLane(store, "nodes", clock, policy=lane_policy)
        self._alive: dict[bytes, gcs_pb2.GcsNodeInfo] = {}
        self._dead: OrderedDict[bytes, gcs_pb2.GcsNodeInfo] = OrderedDict()
        self.alive: Mapping[bytes, gcs_pb2.GcsNodeInfo] = MappingProxyType(self._alive)
        """Alive nodes by id: a read-only live view (changes only on the lane)."""
        self.dead: Mapping[bytes, gcs_pb2.GcsNodeInfo] = MappingProxyType(self._dead)
        """The bounded cache of dead nodes, oldest death first: a read-only live view."""
        self._draining: dict[bytes, DrainRecord] = {}

    # -- startup -------------------------------------------------------------------------
    async def load(self) -> None:
        """Replay the NODE table: alive nodes back into the alive set, dead into the cache."""
        ready = self._store.decoded_rows(TABLE_NODE)  # a takeover's warm, parsed copy
        if ready is not None:
            nodes: Iterable[gcs_pb2.GcsNodeInfo] = ready.values()
        else:
            rows = await self._store.get_all(TABLE_NODE)
            nodes = map(gcs_pb2.GcsNodeInfo.FromString, rows.values())
        dead: list[gcs_pb2.GcsNodeInfo] = []
        for node in nodes:
            if node.state == ALIVE:
                self._alive[node.node_id] = node
            else:
                dead.append(node)
        for node in sorted(dead, key=lambda n: n.end_time_ms):
            self._dead[node.node_id] = node
        prepared = functools.partial(self._store.prepared, TABLE_NODE)
        for listener in self._events:
            listener.on_nodes_loaded(self.alive, prepared)
        log.info("nodes.loaded", alive=len(self._alive), dead=len(self._dead))

    # -- queries (never wait for the lane) -----------------------------------------------
    def get(self, node_id: bytes) -> gcs_pb2.GcsNodeInfo | None:
        return self._alive.get(node_id) or self._dead.get(node_id)

    def is_alive(self, node_id: bytes) -> bool:
        return node_id in self._alive

    def is_dead(self, node_id: bytes) -> bool:
        """Known and dead (while in the dead-node cache)."""
        return node_id in self._dead

    def all_nodes(self) -> Iterable[gcs_pb2.GcsNodeInfo]:
        yield from self._alive.values()
        yield from self._dead.values()

    def total(self) -> int:
        return len(self._alive) + len(self._dead)

    def apply_snapshot(self, node_id: bytes, snapshot: gcs_pb2.NodeSnapshot) -> None:
        """The node's ``state_snapshot`` from its syncer view (Ray's ``UpdateAliveNode``).

        Soft state, as in Ray: in memory only, never persisted, so not on the lane.  The
        record is replaced, not mutated, so caches keyed on the record's identity (the
        autoscaler's per-node bytes) rebuild."""
        node = self._alive.get(node_id)
        if node is None or node.state_snapshot == snapshot:
            return
        updated = gcs_pb2.GcsNodeInfo()
        updated.CopyFrom(node)
        updated.state_snapshot.CopyFrom(snapshot)
        self._alive[node_id] = updated

    # -- mutations (each on the lane) ----------------------------------------------------
    async def register(self, node: gcs_pb2.GcsNodeInfo) -> None:
        """Register (or re-register, idempotently) a validated node."""
        async with self._lane:
            await self._register(node)

    async def _register(self, node: gcs_pb2.GcsNodeInfo) -> None:
        node_id = node.node_id
        if node_id in self._dead:
            raise FailedPrecondition(
                f"node {node_id.hex()} was marked dead; a dead node cannot re-register "
                "(restart the raylet with a new node id)"
            )
        node.state = ALIVE
        node.ClearField("death_info")
        node.end_time_ms = 0
        if not node.start_time_ms:
            node.start_time_ms = now_ms(self._clock)
        if node.is_head_node:
            for other in [n for n in self._alive.values() if n.is_head_node]:
                if other.node_id != node_id and other.node_id in self._alive:
                    await self._kill(
                        other.node_id,
                        common_pb2.NodeDeathInfo(
                            reason=Reason.UNEXPECTED_TERMINATION,
                            reason_message=(
                                "a new head node registered; the old head is presumed dead"
                            ),
                        ),
                    )

        def apply() -> None:
            rejoin = node_id in self._alive
            self._alive[node_id] = node
            if not rejoin:
                for listener in self._events:
                    listener.on_node_added(node)
            self._publish_node(node, full=True)
            log.info(
                "node.registered",
                node_id=node_id.hex(),
                rejoin=rejoin,
                node_type=node.node_type_name,
                address=node.node_manager_address,
            )

        batch = WriteBatch().put(TABLE_NODE, node_id, node.SerializeToString())
        await self._lane.commit(batch, apply)

    async def unregister(self, node_id: bytes, death_info: common_pb2.NodeDeathInfo) -> bool:
        """Graceful exit reported by the raylet.  Unknown or dead ids are a no-op (False)."""
        async with self._lane:
            if node_id not in self._alive:
                return False
            await self._kill(node_id, death_info)
            return True

    async def mark_dead(self, node_id: bytes, reason: int, message: str) -> bool:
        """Unknown or already dead ids are a no-op (False)."""
        async with self._lane:
            if node_id not in self._alive:
                return False
            info = common_pb2.NodeDeathInfo(
                reason=reason,  # type: ignore[arg-type]  # an enum value
                reason_message=message,
            )
            await self._kill(node_id, info)
            return True

    async def fail_unhealthy(self, node_id: bytes) -> bool:
        """Health checks gave up on the node: infer the death reason as Ray does.  A node
        that left meanwhile (unregistered, drained) is a no-op (False)."""
        async with self._lane:
            if node_id not in self._alive:
                return False
            drain = self._draining.get(node_id)
            if (
                drain is not None
                and drain.reason == autoscaler_pb2.DRAIN_NODE_REASON_PREEMPTION
                and drain.deadline_timestamp_ms
                and now_ms(self._clock) > drain.deadline_timestamp_ms
            ):
                info = common_pb2.NodeDeathInfo(
                    reason=Reason.AUTOSCALER_DRAIN_PREEMPTED, reason_message=drain.reason_message
                )
            else:
                info = common_pb2.NodeDeathInfo(
                    reason=Reason.UNEXPECTED_TERMINATION, reason_message=HEALTH_CHECK_DEATH_MESSAGE
                )
            await self._kill(node_id, info)
            return True

    def record_drain(self, node_id: bytes, record: DrainRecord) -> None:
        """Memory only (a hint for the death reason); a dead or unknown node is ignored."""
        if node_id in self._alive:
            self._draining[node_id] = record

    async def _kill(self, node_id: bytes, death_info: common_pb2.NodeDeathInfo) -> None:
        """Persist and apply the death of an alive node.  Hold the lane."""
        node = gcs_pb2.GcsNodeInfo()
        node.CopyFrom(self._alive[node_id])
        node.state = DEAD
        node.end_time_ms = now_ms(self._clock)
        node.death_info.CopyFrom(death_info)
        batch = WriteBatch().put(TABLE_NODE, node_id, node.SerializeToString())
        excess = len(self._dead) + 1 - self._max_dead
        evicted = list(self._dead)[: max(excess, 0)]
        for old_id in evicted:
            batch.delete(TABLE_NODE, old_id)

        def apply() -> None:
            for old_id in evicted:
                self._dead.pop(old_id, None)
            self._alive.pop(node_id, None)
            self._draining.pop(node_id, None)
            self._dead[node_id] = node
            for listener in self._events:
                listener.on_node_dead(node)
            self._publish_node(node, full=False)
            if death_info.reason == Reason.UNEXPECTED_TERMINATION:
                self._publish_error(
                    pubsub_pb2.RAY_ERROR_INFO_CHANNEL,
                    node_id.hex().encode(),
                    node_removed_error(node, node.end_time_ms),
                )
            log.info(
                "node.dead",
                node_id=node_id.hex(),
                reason=common_pb2.NodeDeathInfo.Reason.Name(death_info.reason),
                message=death_info.reason_message,
            )

        await self._lane.commit(batch, apply)

    def _publish_node(self, node: gcs_pb2.GcsNodeInfo, *, full: bool) -> None:
        """The full record on registration; on death Ray publishes only a delta."""
        if full:
            info, liveness = node, address_and_liveness(node)
        else:
            info = gcs_pb2.GcsNodeInfo(
                node_id=node.node_id, state=node.state, end_time_ms=node.end_time_ms
            )
            info.death_info.CopyFrom(node.death_info)
            liveness = gcs_pb2.GcsNodeAddressAndLiveness(node_id=node.node_id, state=node.state)
            liveness.death_info.CopyFrom(node.death_info)
        # The publisher wraps a payload in the channel's PubMessage field itself.
        self._publish(pubsub_pb2.GCS_NODE_INFO_CHANNEL, node.node_id, info)
        self._publish(pubsub_pb2.GCS_NODE_ADDRESS_AND_LIVENESS_CHANNEL, node.node_id, liveness)
