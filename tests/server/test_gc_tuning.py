"""Bounded cyclic-GC pauses (issue 12 item 7): the server freezes what survives a
generation-1 collection, so later collections never rescan the long-lived heap, and
reclaims cycles among frozen objects once the frozen heap has doubled."""

from __future__ import annotations

import gc
import weakref

import pytest

from gcs.server import GcsServer
from gcs.server.gc_policy import SurvivorFreezer, resident_bytes
from gcs.store.memory import MemoryStore
from tests.conftest import fast_config


class _Cell:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic GC frees it


def _freezers() -> int:
    return sum(1 for cb in gc.callbacks if isinstance(cb, SurvivorFreezer))


def _frozen(objects: list[object]) -> list[bool]:
    """Per object: is it in the permanent generation (tracked, but in no generation)?

    Asked of the objects themselves, not of ``gc.get_freeze_count()``: frozen objects of
    earlier tests in this worker may be freed at any time, which lowers the count."""
    in_generations = {id(o) for o in gc.get_objects()}
    return [id(o) not in in_generations for o in objects]


def test_survivors_of_a_generation_1_collection_are_frozen(gc_state: None) -> None:
    gc.callbacks.append(SurvivorFreezer())
    gc.collect(1)
    long_lived = [[i] for i in range(20_000)]
    gc.collect(1)
    assert all(_frozen([long_lived, *long_lived]))


def test_young_cycles_are_still_collected(gc_state: None) -> None:
    gc.callbacks.append(SurvivorFreezer())
    gc.collect(1)
    cell = _Cell()
    ref = weakref.ref(cell)
    del cell
    gc.collect(0)
    assert ref() is None


def test_a_generation_0_collection_freezes_nothing(gc_state: None) -> None:
    """Gen-0 survivors may be in-flight requests: only two-collection survivors freeze."""
    gc.callbacks.append(SurvivorFreezer())
    gc.collect(1)
    young = [[i] for i in range(1000)]
    gc.collect(0)
    assert not any(_frozen([young, *young]))


async def test_the_server_installs_and_removes_the_policy(gc_state: None) -> None:
    server = GcsServer(
        fast_config(gc_gen0_threshold=12_345, gc_gen1_threshold=3), store=MemoryStore()
    )
    await server.start()
    try:
        assert _freezers() == 1
        assert gc.get_threshold()[:2] == (12_345, 3)
    finally:
        await server.stop()
    assert _freezers() == 0


async def test_threshold_0_leaves_python_gc_alone(gc_state: None) -> None:
    gc.set_threshold(700, 10, 10)
    server = GcsServer(fast_config(gc_gen0_threshold=0), store=MemoryStore())
    await server.start()
    try:
        assert _freezers() == 0
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        await server.stop()


def test_cycles_among_frozen_objects_are_reclaimed_once_memory_has_doubled(
    gc_state: None,
) -> None:
    rss = [100 << 20]
    freezer = SurvivorFreezer(growth=2.0, rss=lambda: rss[0], floor_bytes=0)
    gc.callbacks.append(freezer)
    cells = [_Cell() for _ in range(5000)]
    refs = [weakref.ref(c) for c in cells[:10]]
    gc.collect(1)  # the cells survive it: frozen
    del cells  # now cyclic garbage that no automatic collection looks at
    gc.collect()
    assert all(r() is not None for r in refs)
    rss[0] = 200 << 20
    assert not freezer.reclaim_if_grown()  # grown, but not more than twofold
    rss[0] = 201 << 20
    assert freezer.reclaim_if_grown()
    assert all(r() is None for r in refs)
    assert (freezer.baseline, freezer.reclaims) == (201 << 20, 1)
    assert not freezer.reclaim_if_grown()


def test_no_reclaim_below_the_floor(gc_state: None) -> None:
    rss = [100 << 20]
    freezer = SurvivorFreezer(growth=2.0, rss=lambda: rss[0], floor_bytes=512 << 20)
    rss[0] = 400 << 20
    assert not freezer.reclaim_if_grown()
    rss[0] = 513 << 20
    assert freezer.reclaim_if_grown()


def test_resident_bytes_is_read_from_proc() -> None:
    assert resident_bytes() > 1 << 20


def test_reclaim_growth_must_exceed_1() -> None:
    with pytest.raises(ValueError, match="growth"):
        SurvivorFreezer(growth=1.0)
