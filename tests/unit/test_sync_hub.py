"""The syncer hub: newest version per (node, type), relay to the other raylets, bounded
coalescing outboxes, and the views feeding the resource cache, node snapshot and health."""

from __future__ import annotations

import asyncio

from gcs.base.clock import FakeClock
from gcs.managers.events import NodeEvents
from gcs.managers.nodes import NodeManager
from gcs.managers.resources import ResourceCache
from gcs.managers.sync_hub import COMMANDS, RESOURCE_VIEW, SyncHub
from gcs.proto import gcs_pb2, ray_syncer_pb2
from gcs.store.memory import MemoryStore

A, B, C = (bytes([i]) * 28 for i in (1, 2, 3))


def _node(node_id: bytes) -> gcs_pb2.GcsNodeInfo:
    return gcs_pb2.GcsNodeInfo(
        node_id=node_id,
        node_manager_address="127.0.0.1",
        node_manager_port=1000 + node_id[0],
        resources_total={"CPU": 4},
        state=gcs_pb2.GcsNodeInfo.ALIVE,
    )


def _view(node_id: bytes, version: int, **fields: object) -> ray_syncer_pb2.RaySyncMessage:
    view = ray_syncer_pb2.ResourceViewSyncMessage(**fields)  # type: ignore[arg-type]
    return ray_syncer_pb2.RaySyncMessage(
        version=version,
        message_type=RESOURCE_VIEW,
        node_id=node_id,
        sync_message=view.SerializeToString(),
    )


class Hub:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.cache = ResourceCache(self.clock)
        self.events = NodeEvents(self.cache)
        self.nodes = NodeManager(MemoryStore(), self.clock, events=self.events)
        self.beats: list[bytes] = []
        self.hub = SyncHub(self.nodes, self.cache, on_heartbeat=self.beats.append)
        self.events.subscribe(self.hub)

    async def register(self, *ids: bytes) -> None:
        for node_id in ids:
            await self.nodes.register(_node(node_id))


async def _take(peer, n: int = 100) -> list[ray_syncer_pb2.RaySyncMessage]:
    entries = await asyncio.wait_for(peer.take(n), timeout=5)
    return list(ray_syncer_pb2.RaySyncMessageBatch.FromString(b"".join(entries)).messages)


async def test_a_view_is_relayed_to_the_other_raylets_not_back_to_its_sender() -> None:
    h = Hub()
    await h.register(A, B, C)
    pa, pb, pc = h.hub.connect(A), h.hub.connect(B), h.hub.connect(C)
    assert h.hub.receive(pa, _view(A, 1, resources_available={"CPU": 3}))
    assert [m.node_id for m in await _take(pb)] == [A]
    assert [m.node_id for m in await _take(pc)] == [A]
    assert len(pa) == 0


async def test_stale_versions_are_dropped_and_a_late_joiner_gets_the_newest() -> None:
    h = Hub()
    await h.register(A, B)
    pa = h.hub.connect(A)
    assert h.hub.receive(pa, _view(A, 5, resources_available={"CPU": 1}))
    assert not h.hub.receive(pa, _view(A, 5, resources_available={"CPU": 2}))
    assert not h.hub.receive(pa, _view(A, 4, resources_available={"CPU": 2}))
    assert h.hub.stats.stale == 2
    pb = h.hub.connect(B)
    [got] = await _take(pb)
    assert got.version == 5
    view = ray_syncer_pb2.ResourceViewSyncMessage.FromString(got.sync_message)
    assert dict(view.resources_available) == {"CPU": 1}


async def test_a_slow_peer_holds_only_the_newest_message_per_node_and_type() -> None:
    """Bounded outbox: 1,000 updates from 3 nodes while B never reads -> 3 queued."""
    h = Hub()
    await h.register(A, B, C)
    pa, pb, pc = h.hub.connect(A), h.hub.connect(B), h.hub.connect(C)
    for version in range(1, 501):
        h.hub.receive(pa, _view(A, version, resources_available={"CPU": version % 4}))
        h.hub.receive(pc, _view(C, version))
    commands = ray_syncer_pb2.RaySyncMessage(
        version=1, message_type=COMMANDS, node_id=A, sync_message=b"\x08\x01"
    )
    h.hub.receive(pa, commands)
    assert len(pb) == 3
    batch = await _take(pb)
    assert {(m.node_id, m.message_type, m.version) for m in batch} == {
        (A, RESOURCE_VIEW, 500),
        (C, RESOURCE_VIEW, 500),
        (A, COMMANDS, 1),
    }
    assert h.hub.stats.coalesced > 900


async def test_views_feed_the_resource_cache_node_snapshot_and_health() -> None:
    h = Hub()
    await h.register(A, B)
    pa = h.hub.connect(A)
    h.hub.receive(
        pa,
        _view(
            A,
            1,
            resources_available={"CPU": 1},
            resources_total={"CPU": 4},
            node_activity=["Resource: CPU currently in use."],
        ),
    )
    data = h.cache.nodes[A].data
    assert dict(data.resources_available) == {"CPU": 1}
    snap = h.nodes.alive[A].state_snapshot
    assert snap.state == gcs_pb2.NodeSnapshot.ACTIVE
    assert list(snap.node_activity) == ["Resource: CPU currently in use."]
    assert h.beats == [A]
    h.hub.receive(pa, _view(A, 2, resources_available={"CPU": 4}, idle_duration_ms=1500))
    snap = h.nodes.alive[A].state_snapshot
    assert (snap.state, snap.idle_duration_ms) == (gcs_pb2.NodeSnapshot.IDLE, 1500)
    assert h.cache.nodes[A].data.idle_duration_ms == 1500
    h.hub.receive(pa, _view(A, 3, is_draining=True, draining_deadline_timestamp_ms=9))
    assert h.nodes.alive[A].state_snapshot.state == gcs_pb2.NodeSnapshot.DRAINING
    assert h.cache.draining() == [(A, 9)]


async def test_dead_and_unknown_nodes_are_not_relayed_and_a_dead_node_is_forgotten() -> None:
    h = Hub()
    await h.register(A, B)
    pa, pb = h.hub.connect(A), h.hub.connect(B)
    assert not h.hub.receive(pa, _view(C, 1))  # never registered
    assert h.hub.receive(pa, _view(A, 1))
    await h.nodes.mark_dead(A, 2, "test")
    assert pa.closed and A not in h.hub.peers
    assert not h.hub.receive(pa, _view(A, 2))
    late = h.hub.connect(C)
    assert len(late) == 0  # A's view is gone
    assert [m.node_id for m in await _take(pb)] == [A]  # queued before the death


async def test_a_second_stream_of_one_node_replaces_the_first() -> None:
    h = Hub()
    await h.register(A)
    first = h.hub.connect(A)
    second = h.hub.connect(A)
    assert first.closed and await first.take(10) is None
    h.hub.disconnect(first)  # the old stream ending later does not drop the new one
    assert h.hub.peers[A] is second
