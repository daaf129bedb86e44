"""Syncer views are held as received and merged into a node's ``ResourcesData`` only when
someone reads it (issue 30: with 1,000 placement groups every view carries ~160 group
names per map, and copying them on every view made each group created cost more than the
last).  What a reader sees is what merging every view at once gave."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gcs.base.clock import FakeClock
from gcs.managers.resources import ResourceCache
from gcs.policy.placement.naming import bundle_resources
from gcs.proto import gcs_pb2, ray_syncer_pb2

A = b"\x01" * 28


def _cache() -> ResourceCache:
    cache = ResourceCache(FakeClock())
    cache.on_node_added(
        gcs_pb2.GcsNodeInfo(
            node_id=A,
            node_manager_address="127.0.0.1",
            resources_total={"CPU": 8.0},
            labels={"zone": "a"},
        )
    )
    return cache


def _with_groups(groups: int, cpu: float) -> dict[str, float]:
    names = {"CPU": cpu, "memory": 1e9}
    for n in range(groups):
        indexed, wildcard = bundle_resources(n.to_bytes(18, "big"), 0, {"CPU": 0.01})
        names.update(indexed)
        names.update(wildcard)
    return names


def _view(groups: int, cpu: float, **fields: object) -> ray_syncer_pb2.ResourceViewSyncMessage:
    resources = _with_groups(groups, cpu)
    return ray_syncer_pb2.ResourceViewSyncMessage(
        resources_available=resources, resources_total=resources, **fields
    )


def test_views_are_merged_once_when_read_not_once_each() -> None:
    cache = _cache()
    entry = cache.nodes[A]
    for groups in range(1, 41):
        assert cache.apply_view(A, _view(groups, 8.0 - groups / 100, idle_duration_ms=0))
    assert entry.merges == 0  # forty views, none copied
    assert entry.generation == 40
    data = entry.data
    assert entry.merges == 1
    assert dict(data.resources_total) == _with_groups(40, 7.6)
    assert data.node_manager_address == "127.0.0.1" and dict(data.labels) == {"zone": "a"}
    assert entry.data is data and entry.merges == 1  # read again: nothing more to merge


def test_the_scheduler_reads_held_views_without_merging_them() -> None:
    cache = _cache()
    entry = cache.nodes[A]
    cache.apply_view(A, _view(30, 6.0, is_draining=True))
    available, total = entry.resource_maps()
    assert available["CPU"] == 6.0 and len(total) == 2 + 4 * 30
    assert entry.is_draining and entry.merges == 0


def test_generation_moves_with_resources_and_labels_only() -> None:
    cache = _cache()
    entry = cache.nodes[A]
    cache.apply_view(A, _view(3, 7.0, idle_duration_ms=5))
    first = entry.generation
    cache.apply_view(A, _view(3, 7.0, idle_duration_ms=900, node_activity=["busy"]))
    assert entry.generation == first  # idle time and activity are not resources
    cache.apply_view(A, _view(3, 6.5))
    assert entry.generation == first + 1
    cache.apply_view(A, _view(3, 6.5, labels={"zone": "b"}))
    assert entry.generation == first + 2
    assert entry.data.idle_duration_ms == 0 and dict(entry.data.labels) == {"zone": "b"}


def _eager(
    old: gcs_pb2.ResourcesData, view: ray_syncer_pb2.ResourceViewSyncMessage
) -> gcs_pb2.ResourcesData:
    """The merge as it was done on every view before (the reference)."""
    data = gcs_pb2.ResourcesData()
    data.CopyFrom(old)
    data.resources_available.clear()
    data.resources_available.update(view.resources_available)
    if view.resources_total:
        data.resources_total.clear()
        data.resources_total.update(view.resources_total)
    data.idle_duration_ms = view.idle_duration_ms
    data.is_draining = view.is_draining
    data.draining_deadline_timestamp_ms = view.draining_deadline_timestamp_ms
    data.object_pulls_queued = view.object_pulls_queued
    if view.labels:
        data.labels.clear()
        data.labels.update(view.labels)
    return data


_views = st.builds(
    lambda groups, cpu, with_total, labels, idle, draining, poll: (
        ray_syncer_pb2.ResourceViewSyncMessage(
            resources_available=_with_groups(groups, cpu),
            resources_total=_with_groups(groups, 8.0) if with_total else {},
            labels=labels,
            idle_duration_ms=idle,
            is_draining=draining,
            draining_deadline_timestamp_ms=7 if draining else 0,
        ),
        poll,
    ),
    st.integers(0, 3),
    st.sampled_from([8.0, 7.5, 7.0]),
    st.booleans(),
    st.sampled_from([{}, {"zone": "a"}, {"zone": "b"}]),
    st.sampled_from([0, 10, 20]),
    st.booleans(),
    st.sampled_from([False, False, False, True]),
)


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(_views, st.booleans()), min_size=1, max_size=8))
def test_what_a_reader_sees_is_the_views_merged_one_by_one(
    steps: list[tuple[tuple[ray_syncer_pb2.ResourceViewSyncMessage, bool], bool]],
) -> None:
    """Views (with or without totals and labels), polls and reads in any order: ``data``
    equals merging each view as it came, and a view that changes resources or labels
    always moves the generation."""
    cache = _cache()
    entry = cache.nodes[A]
    reference = gcs_pb2.ResourcesData()
    reference.CopyFrom(entry.data)
    for (view, poll), read in steps:
        if poll:  # a load poll replaces the whole report
            polled = gcs_pb2.ResourcesData()
            polled.CopyFrom(reference)
            polled.resources_available["CPU"] = 1.0
            cache.apply(A, polled)
            reference = gcs_pb2.ResourcesData()
            reference.CopyFrom(polled)
        expected = _eager(reference, view)
        moved = (
            dict(expected.resources_available) != dict(reference.resources_available)
            or dict(expected.resources_total) != dict(reference.resources_total)
            or dict(expected.labels) != dict(reference.labels)
        )
        before = entry.generation
        copy = ray_syncer_pb2.ResourceViewSyncMessage()
        copy.CopyFrom(view)
        cache.apply_view(A, copy)
        assert entry.generation >= before + moved
        reference = expected
        if read:
            assert entry.data == reference
    assert entry.data == reference
