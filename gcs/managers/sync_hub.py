"""The GCS side of Ray's syncer (``ray.rpc.syncer.RaySyncer/StartSync``): a hub.

Each raylet keeps one bidi stream to the GCS and sends its own RESOURCE_VIEW (available and
total resources, idle time, draining, activity) and COMMANDS (global GC) messages when they
change, each with a per-node, increasing ``version``.  The hub keeps the newest message per
(node, type), drops any whose version is not newer (Ray does the same), and relays every
accepted message to every other connected raylet, so raylets learn each other's resources
(spillback, SPREAD and NodeAffinity scheduling depend on it).  A raylet that connects first
receives the newest message of every other node.

Per peer, the outbox holds at most one message per (node, type): a newer version replaces
the queued one, so a queue is bounded by twice the number of nodes and a slow raylet only
ever receives the newest views; fan-out is a dict insert per peer, so a slow or stuck
stream never delays the others (its writer is its own task, or a flush callback on the
front server).  Each accepted message is encoded once, as its ``RaySyncMessageBatch``
entry: a peer's batch is the concatenation of its queued entries (no protobuf work per
peer).

RESOURCE_VIEW messages also feed the GCS: the resource cache (available/total, idle,
draining), the node's ``state_snapshot`` (``node_activity``, IDLE/ACTIVE/DRAINING) and the
health checker (any syncer message counts as a heartbeat, as in Ray).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import structlog
from google.protobuf.message import DecodeError

from gcs.base.changes import Changes
from gcs.base.protowire import len_field
from gcs.managers.events import NodeDeathListener
from gcs.managers.nodes import NodeManager
from gcs.managers.resources import ResourceCache
from gcs.proto import gcs_pb2, ray_syncer_pb2

log = structlog.get_logger("gcs.syncer")

RESOURCE_VIEW = ray_syncer_pb2.RESOURCE_VIEW
COMMANDS = ray_syncer_pb2.COMMANDS
MESSAGE_TYPES = (RESOURCE_VIEW, COMMANDS)
GCS_SYNCER_NODE_ID = "0" * 56
"""The GCS's own syncer node id, hex (28 zero bytes), sent as initial metadata."""

Key = tuple[bytes, int]
"""(node id, message type)."""


@dataclass(slots=True)
class SyncStats:
    received: int = 0
    accepted: int = 0
    stale: int = 0
    """Dropped: version not newer than the one held."""
    unknown_node: int = 0
    """Dropped: the node is not alive (dead, or never registered)."""
    undecodable: int = 0
    relayed: int = 0
    """Messages handed to peers' outboxes."""
    coalesced: int = 0
    """Queued messages replaced by a newer version before their peer took them."""


class Peer:
    """One connected raylet: its coalescing outbox of encoded batch entries.

    ``notify`` (the front server's flush) is called when the outbox stops being empty and
    when the peer closes; the grpc.aio writer waits in :meth:`take` instead."""

    def __init__(
        self, node_id: bytes, stats: SyncStats, notify: Callable[[], None] | None = None
    ) -> None:
        self.node_id = node_id
        self._stats = stats
        self._notify = notify
        self._outbox: dict[Key, bytes] = {}
        self._ready = asyncio.Event()
        self.closed = False

    def __len__(self) -> int:
        return len(self._outbox)

    def offer(self, key: Key, entry: bytes) -> None:
        outbox = self._outbox
        if outbox.pop(key, None) is not None:
            self._stats.coalesced += 1
        elif not outbox and self._notify is not None:
            self._notify()
        outbox[key] = entry
        self._stats.relayed += 1
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()
        if self._notify is not None:
            self._notify()

    def drain(self, max_messages: int) -> list[bytes]:
        """Up to ``max_messages`` queued entries, oldest first (removed)."""
        outbox = self._outbox
        if len(outbox) <= max_messages:
            batch = list(outbox.values())
            outbox.clear()
            return batch
        keys = list(outbox)[:max_messages]
        return [outbox.pop(key) for key in keys]

    async def take(self, max_messages: int) -> list[bytes] | None:
        """The next batch of entries (oldest first, at most ``max_messages``); None once
        closed.  ``b"".join(batch)`` is a serialized ``RaySyncMessageBatch``."""
        while not self._outbox:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        if self.closed:
            return None
        return self.drain(max_messages)


class SyncHub(NodeDeathListener):
    def __init__(
        self,
        nodes: NodeManager,
        resources: ResourceCache,
        *,
        on_heartbeat: Callable[[bytes], None],
    ) -> None:
        self._nodes = nodes
        self._resources = resources
        self._on_heartbeat = on_heartbeat
        self._views: dict[Key, ray_syncer_pb2.RaySyncMessage] = {}
        self._entries: dict[Key, bytes] = {}
        """The held messages, encoded as batch entries (what peers are sent)."""
        self._peers: dict[bytes, Peer] = {}
        self.stats = SyncStats()
        self.changes = Changes()
        """Notified when a stream opens or a message is accepted."""

    # -- NodeListener ------------------------------------------------------------------
    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        """A dead node's views are forgotten (never sent to raylets joining later) and its
        stream is closed."""
        for kind in MESSAGE_TYPES:
            self._views.pop((node.node_id, kind), None)
            self._entries.pop((node.node_id, kind), None)
        peer = self._peers.pop(node.node_id, None)
        if peer is not None:
            peer.close()

    # -- queries -------------------------------------------------------------------------
    @property
    def peers(self) -> Mapping[bytes, Peer]:
        """Connected raylets by node id (read-only)."""
        return MappingProxyType(self._peers)

    def version(self, node_id: bytes, kind: int = RESOURCE_VIEW) -> int | None:
        held = self._views.get((node_id, kind))
        return held.version if held is not None else None

    def live_version(self, node_id: bytes) -> int | None:
        """The node's RESOURCE_VIEW version while its stream is up (else None): what the
        load poller compares to back off (adaptive polling)."""
        if node_id not in self._peers:
            return None
        return self.version(node_id)

    # -- streams -------------------------------------------------------------------------
    def connect(self, node_id: bytes, notify: Callable[[], None] | None = None) -> Peer:
        """A raylet opened its stream: it gets the newest message of every other node.  A
        second stream of one node replaces the first (which is closed)."""
        old = self._peers.pop(node_id, None)
        if old is not None:
            old.close()
        peer = Peer(node_id, self.stats, notify)
        for key, entry in self._entries.items():
            if key[0] != node_id:
                peer.offer(key, entry)
        self._peers[node_id] = peer
        self.changes.notify()
        log.debug("syncer.connected", node_id=node_id.hex(), queued=len(peer))
        return peer

    def disconnect(self, peer: Peer) -> None:
        peer.close()
        if self._peers.get(peer.node_id) is peer:
            del self._peers[peer.node_id]

    def receive(self, sender: Peer, message: ray_syncer_pb2.RaySyncMessage) -> bool:
        """Accept a newer message, feed the GCS, relay it; False when dropped."""
        stats = self.stats
        stats.received += 1
        node_id = message.node_id
        if not self._nodes.is_alive(node_id):
            stats.unknown_node += 1
            return False
        key = (node_id, message.message_type)
        held = self._views.get(key)
        if held is not None and message.version <= held.version:
            stats.stale += 1
            return False
        if message.message_type == RESOURCE_VIEW:
            try:
                view = ray_syncer_pb2.ResourceViewSyncMessage.FromString(message.sync_message)
            except DecodeError:
                stats.undecodable += 1
                log.warning("syncer.undecodable_view", node_id=node_id.hex())
                return False
            self._nodes.apply_snapshot(node_id, _snapshot(view))
            self._resources.apply_view(node_id, view)  # takes the view over
        self._on_heartbeat(node_id)
        self._views[key] = message
        entry = self._entries[key] = len_field(1, message.SerializeToString())
        stats.accepted += 1
        for peer in self._peers.values():
            if peer is not sender and peer.node_id != node_id:
                peer.offer(key, entry)
        self.changes.notify()
        return True


def _snapshot(view: ray_syncer_pb2.ResourceViewSyncMessage) -> gcs_pb2.NodeSnapshot:
    """Ray's ``UpdateAliveNode``: idle (with its duration) or active (with the raylet's
    activity strings); draining overrides the state and keeps the rest."""
    snap = gcs_pb2.NodeSnapshot()
    if view.idle_duration_ms > 0:
        snap.state = gcs_pb2.NodeSnapshot.IDLE
        snap.idle_duration_ms = view.idle_duration_ms
    else:
        snap.state = gcs_pb2.NodeSnapshot.ACTIVE
        snap.node_activity.extend(view.node_activity)
    if view.is_draining:
        snap.state = gcs_pb2.NodeSnapshot.DRAINING
    return snap
