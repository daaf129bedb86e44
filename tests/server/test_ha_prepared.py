"""A hot standby's per-node state built ahead (``gcs.server.ha_mirror.PREPARED``): the mirror
builds each node row's views as the row arrives, and a takeover's load adopts them instead
of building 10,000 again -- the same state as a cold load, from the same rows."""

from __future__ import annotations

import gc
import random

import pytest
from prometheus_client import CollectorRegistry

from gcs.base.clock import FakeClock
from gcs.config import HealthCheckConfig
from gcs.managers.events import NodeEvents
from gcs.managers.health import HealthChecker, node_health
from gcs.managers.nodes import NodeManager
from gcs.managers.resources import ResourceCache, node_entry
from gcs.policy.virtual_clusters.convert import node_view_from_gcs_node_info
from gcs.proto import gcs_pb2
from gcs.server.gc_policy import GcTuning
from gcs.server.ha_mirror import TableMirror, TakeoverStore
from gcs.store.base import TABLE_NODE, Store, WriteBatch
from gcs.store.memory import MemoryStore
from gcs.store.metered import MeteredStore
from gcs.testing.fake_raylets import FakeRayletGateway

ALIVE, DEAD = gcs_pb2.GcsNodeInfo.ALIVE, gcs_pb2.GcsNodeInfo.DEAD


def _node(n: int, state: int = ALIVE, cpus: float = 4.0) -> gcs_pb2.GcsNodeInfo:
    return gcs_pb2.GcsNodeInfo(
        node_id=b"%28d" % n,
        node_manager_address=f"10.0.0.{n}",
        node_manager_port=7000 + n,
        state=state,  # type: ignore[arg-type]
        resources_total={"CPU": cpus},
        labels={"pool": "a"},
        node_type_name=f"t{n % 2}",
    )


def _put(*nodes: gcs_pb2.GcsNodeInfo) -> WriteBatch:
    batch = WriteBatch()
    for info in nodes:
        batch.put(TABLE_NODE, info.node_id, info.SerializeToString())
    return batch


async def _warm(store: MemoryStore, mirror: TableMirror | None = None) -> TakeoverStore:
    mirror = mirror or TableMirror()
    await mirror.load(store)
    return TakeoverStore(store, mirror, on_fenced=lambda: None)


async def test_the_mirror_builds_each_node_rows_views_as_the_row_arrives() -> None:
    """At load, from followed changes and from the term's own writes; a deleted row's views
    go with it, a changed row's are rebuilt from the new row."""
    store = MemoryStore()
    await store.write(_put(_node(1), _node(2)))
    mirror = TableMirror()
    await mirror.load(store)
    await store.write(_put(_node(1, cpus=8.0), _node(3)).delete(TABLE_NODE, _node(2).node_id))
    await mirror.drain(store)
    term = TakeoverStore(store, mirror, on_fenced=lambda: None)
    await term.write(_put(_node(4)))

    decoded = mirror.decoded[TABLE_NODE]
    assert set(decoded) == {_node(n).node_id for n in (1, 3, 4)}
    for view in (node_entry, node_health, node_view_from_gcs_node_info):
        built = mirror.prepared[TABLE_NODE][view]
        assert built == {key: (row, view(row)) for key, row in decoded.items()}, view.__name__
        assert all(built[key][0] is row for key, row in decoded.items())
    _, entry = mirror.prepared[TABLE_NODE][node_entry][_node(1).node_id]
    assert dict(entry.data.resources_total) == {"CPU": 8.0}, "rebuilt from the changed row"


async def test_a_takeover_hands_each_view_over_once_and_only_for_its_own_row() -> None:
    store = MemoryStore()
    await store.write(_put(_node(1), _node(2)))
    term = await _warm(store)
    mirror = term._mirror
    assert mirror is not None
    rows = mirror.decoded[TABLE_NODE]
    built = {k: made for k, (_, made) in mirror.prepared[TABLE_NODE][node_entry].items()}
    one, two = _node(1).node_id, _node(2).node_id
    stranger = _node(2)  # same key and content, another object: not what the mirror parsed

    got = term.prepared(TABLE_NODE, node_entry, [(one, rows[one]), (two, stranger)])
    assert got[one] is built[one], "adopted"
    assert got[two] is not built[two] and got[two] == built[two], "built here"
    again = term.prepared(TABLE_NODE, node_entry, [(one, rows[one])])
    assert again[one] is not got[one], "a mutable view is handed over once"

    def not_kept(node: gcs_pb2.GcsNodeInfo) -> bytes:
        return node.node_id

    assert term.prepared(TABLE_NODE, not_kept, rows.items()) == {one: one, two: two}
    term.release_mirror()
    later = term.prepared(TABLE_NODE, node_health, [(two, rows[two])])
    assert later[two] is not mirror.prepared[TABLE_NODE][node_health][two][1]


async def test_a_view_that_fails_is_left_to_the_load_which_fails_as_a_cold_start() -> None:
    def fussy(node: gcs_pb2.GcsNodeInfo) -> int:
        if node.node_manager_port == 7002:
            raise ValueError("no such port")
        return node.node_manager_port

    store = MemoryStore()
    await store.write(_put(_node(1), _node(2)))
    mirror = TableMirror(views={TABLE_NODE: (fussy,)})
    term = await _warm(store, mirror)
    assert set(mirror.prepared[TABLE_NODE][fussy]) == {_node(1).node_id}
    rows = mirror.decoded[TABLE_NODE]
    with pytest.raises(ValueError, match="no such port"):
        term.prepared(TABLE_NODE, fussy, rows.items())


def _health(rng_seed: int, clock: FakeClock) -> HealthChecker:
    config = HealthCheckConfig(initial_delay_ms=1000, period_ms=3000, failure_threshold=4)
    nodes = NodeManager(MemoryStore(), clock)
    return HealthChecker(nodes, FakeRayletGateway(), clock, config, rng=random.Random(rng_seed))


def _schedule(checker: HealthChecker) -> list[tuple[bytes, str, float, int]]:
    """Each node's record, in the order its first checks fall due."""
    out = []
    for _, _, node_id in sorted(checker._due):
        state = checker._state[node_id]
        out.append((node_id, state.address, state.next_check_s, state.failures_left))
    return out


async def _loaded(
    store: Store, clock: FakeClock
) -> tuple[NodeManager, ResourceCache, HealthChecker]:
    cache, health = ResourceCache(clock), _health(7, clock)
    nodes = NodeManager(
        MeteredStore(store, CollectorRegistry()), clock, events=NodeEvents(cache, health)
    )
    await nodes.load()
    return nodes, cache, health


async def test_a_takeover_load_adopts_the_standbys_entries_and_equals_a_cold_load() -> None:
    """Resource cache and health checker: the takeover's state is the mirror's objects,
    stamped at load, and equal to what a cold load of the same rows builds (the health
    checker draws the same first-check times)."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    await store.write(_put(*(_node(n) for n in range(1, 6)), _node(6, DEAD)))
    term = await _warm(store)
    mirror = term._mirror
    assert mirror is not None
    warm_entries = {k: made for k, (_, made) in mirror.prepared[TABLE_NODE][node_entry].items()}
    warm_health = {k: made for k, (_, made) in mirror.prepared[TABLE_NODE][node_health].items()}
    clock.advance(30.0)

    _, cache, health = await _loaded(term, clock)
    _, cold_cache, cold_health = await _loaded(store, clock)

    alive = {_node(n).node_id for n in range(1, 6)}
    assert set(cache.nodes) == set(cold_cache.nodes) == alive
    for node_id in alive:
        assert cache.nodes[node_id] is warm_entries[node_id]
        assert health._state[node_id] is warm_health[node_id]
        assert cache.nodes[node_id] == cold_cache.nodes[node_id]
        assert cache.nodes[node_id].updated_mono_s == clock.monotonic_s()
    assert _schedule(health) == _schedule(cold_health)

    later = clock.monotonic_s() + 10.0  # past the initial delay and one period: all queued
    health._queue_loaded(later)
    cold_health._queue_loaded(later)
    assert len(_schedule(health)) == 5
    assert _schedule(health) == _schedule(cold_health)


async def test_the_virtual_clusters_replay_adopts_the_standbys_node_views() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    await store.write(_put(_node(1), _node(2, DEAD)))
    term = await _warm(store)
    mirror = term._mirror
    assert mirror is not None
    views = {
        k: made
        for k, (_, made) in mirror.prepared[TABLE_NODE][node_view_from_gcs_node_info].items()
    }
    nodes = NodeManager(term, clock)
    await nodes.load()
    got = term.prepared(
        TABLE_NODE, node_view_from_gcs_node_info, [*nodes.alive.items(), *nodes.dead.items()]
    )
    assert all(got[key] is views[key] for key in views)
    assert [v.is_dead for v in got.values()] == [False, True]


async def test_a_term_does_not_walk_the_heap_its_standby_froze(
    gc_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``gc.get_freeze_count`` walks every frozen object (~10 ms at 10,000 nodes)."""

    def walk() -> int:
        raise AssertionError("walked the frozen heap")

    monkeypatch.setattr(gc, "get_freeze_count", walk)
    tuning = GcTuning(
        FakeClock(), gen0_threshold=50_000, gen1_threshold=50, freeze_survivors=False,
        start_heap_frozen=True,
    )  # fmt: skip
    await tuning.load()
    with pytest.raises(AssertionError, match="walked"):
        await GcTuning(
            FakeClock(), gen0_threshold=50_000, gen1_threshold=50, freeze_survivors=False
        ).load()
