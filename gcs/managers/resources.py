"""Per-node resource view fed by load polling, and the cluster-wide pending demand.

``ResourceCache`` keeps, per alive node, the last ``ResourcesData`` a raylet reported (Ray's
``GcsAutoscalerStateManager::node_resource_info_``) and maintains the aggregate of pending
demand by (shape, label selectors) *incrementally*: when a node's load changes only its own
contribution is swapped, so reading 10,000 pending shapes does not rescan 2,000 nodes.

It is fed by :mod:`gcs.managers.load_poller` and by the syncer's views
(:mod:`gcs.managers.sync_hub`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import structlog

from gcs.base.clock import Clock
from gcs.base.protowire import int_field, len_field
from gcs.managers.events import Prepared
from gcs.proto import autoscaler_pb2, gcs_pb2, ray_syncer_pb2

log = structlog.get_logger("gcs.resources")

DemandKey = tuple[tuple[tuple[str, float], ...], tuple[bytes, ...]]
Counts = tuple[int, int, int]  # ready, infeasible, backlog


def demand_key(demand: gcs_pb2.ResourceDemand) -> DemandKey:
    shape = tuple(sorted(demand.shape.items()))
    selectors = tuple(s.SerializeToString(deterministic=True) for s in demand.label_selectors)
    return shape, selectors


def _add_jobs(
    total: dict[bytes, dict[DemandKey, int]],
    part: Mapping[bytes, Mapping[DemandKey, int]],
    sign: int,
) -> None:
    for job_id, rows in part.items():
        mine = total.setdefault(job_id, {})
        for key, count in rows.items():
            left = mine.get(key, 0) + sign * count
            if left > 0:
                mine[key] = left
            else:
                mine.pop(key, None)
        if not mine:
            del total[job_id]


class NodeResources:
    """One node's held report.  ``data`` is the ``ResourcesData`` readers see; a syncer view
    is held as received and merged into ``data`` only when someone reads it (a view's maps
    carry every committed bundle's names, so copying them on every view would cost each
    view the node's whole map: a placement-group burst sends one per bundle change)."""

    __slots__ = (
        "_data", "_fingerprint", "_pending", "demand", "generation", "job_demand",
        "load_bytes", "merges", "updated_mono_s",
    )  # fmt: skip

    def __init__(
        self, data: gcs_pb2.ResourcesData, updated_mono_s: float, generation: int = 0
    ) -> None:
        self._data = data
        self._pending: _Pending | None = None
        self._fingerprint: bytes | None = None
        """The resource maps and labels of the last view (:func:`view_fingerprint`), None
        once a report of another kind replaced it."""
        self.updated_mono_s = updated_mono_s
        self.generation = generation
        """Bumped when available / total / labels change (caches of them key on it)."""
        self.load_bytes = b""
        self.demand: dict[DemandKey, Counts] = {}
        #: The part of ``demand`` whose rows name their job (our raylets' ``job_id``), by job.
        self.job_demand: dict[bytes, dict[DemandKey, int]] = {}
        self.merges = 0
        """Held views merged into ``data`` (tests count the work done)."""

    def _values(self) -> tuple[object, ...]:
        return (
            self.data, self.updated_mono_s, self.generation, self.load_bytes, self.demand,
            self.job_demand,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NodeResources):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return f"NodeResources(generation={self.generation}, data={self.data!r})"

    @property
    def data(self) -> gcs_pb2.ResourcesData:
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._data = _merged(self._data, pending)
            self.merges += 1
        return self._data

    @data.setter
    def data(self, data: gcs_pb2.ResourcesData) -> None:
        self._data = data
        self._pending = None
        self._fingerprint = None

    def resource_maps(self) -> tuple[Mapping[str, float], Mapping[str, float]]:
        """(available, total) as last reported, without building ``data``."""
        pending = self._pending
        if pending is None:
            return self._data.resources_available, self._data.resources_total
        view, with_total = pending[0], pending[1]
        total = with_total.resources_total if with_total is not None else None
        return view.resources_available, total or self._data.resources_total

    @property
    def is_draining(self) -> bool:
        pending = self._pending
        return pending[3][1] if pending is not None else self._data.is_draining

    def take_view(self, view: ray_syncer_pb2.ResourceViewSyncMessage) -> bool:
        """Hold a view until ``data`` is read; whether its resources or labels differ from
        the held ones.  A view without totals (or labels) keeps the last ones: the newest
        view that had them is held along.  Takes ``view`` over (see
        :func:`view_fingerprint`)."""
        held = self._fingerprint
        if held is None:  # the last report was a poll (or none): compare values, once
            data = self.data
            changed = (
                dict(view.resources_available) != dict(data.resources_available)
                or (bool(view.resources_total)
                    and dict(view.resources_total) != dict(data.resources_total))
                or (bool(view.labels) and dict(view.labels) != dict(data.labels))
            )  # fmt: skip
        fingerprint, scalars = view_fingerprint(view)
        if held is not None:
            changed = fingerprint != held
        pending = self._pending
        with_total = view if view.resources_total else (pending[1] if pending else None)
        with_labels = view if view.labels else (pending[2] if pending else None)
        self._pending = (view, with_total, with_labels, scalars)
        self._fingerprint = fingerprint
        return changed


_Scalars = tuple[int, bool, int, bool]
"""A view's (idle_duration_ms, is_draining, draining_deadline_timestamp_ms,
object_pulls_queued)."""
_View = ray_syncer_pb2.ResourceViewSyncMessage
_Pending = tuple[_View, _View | None, _View | None, _Scalars]
"""(the newest view, the newest with totals, the newest with labels, the newest's scalars)."""


def view_fingerprint(view: ray_syncer_pb2.ResourceViewSyncMessage) -> tuple[bytes, _Scalars]:
    """(the view's resource maps and labels as bytes, its scalars).  Clears every other
    field of ``view`` (the caller hands it over): what is left is what ``generation``
    stands for, serialized in C (no per-name Python work)."""
    scalars = (
        view.idle_duration_ms,
        view.is_draining,
        view.draining_deadline_timestamp_ms,
        view.object_pulls_queued,
    )
    for name in _SCALAR_FIELDS:
        view.ClearField(name)
    return view.SerializeToString(), scalars


_SCALAR_FIELDS = (
    "idle_duration_ms",
    "is_draining",
    "draining_deadline_timestamp_ms",
    "object_pulls_queued",
    "node_activity",
)


def _merged(old: gcs_pb2.ResourcesData, pending: _Pending) -> gcs_pb2.ResourcesData:
    """``old`` with the held views' resources, labels, idle and draining (the load stays
    as polled)."""
    view, with_total, with_labels, scalars = pending
    data = gcs_pb2.ResourcesData()
    data.CopyFrom(old)
    data.ClearField("resources_available")
    data.resources_available.update(view.resources_available)
    if with_total is not None:
        data.ClearField("resources_total")
        data.resources_total.update(with_total.resources_total)
    if with_labels is not None:
        data.ClearField("labels")
        data.labels.update(with_labels.labels)
    (
        data.idle_duration_ms,
        data.is_draining,
        data.draining_deadline_timestamp_ms,
        data.object_pulls_queued,
    ) = scalars
    return data


def node_entry(node: gcs_pb2.GcsNodeInfo) -> NodeResources:
    """A newly added node's view: its totals, all available, no report yet (the caller sets
    ``updated_mono_s``).  A hot standby builds these ahead (``gcs.server.ha_mirror``)."""
    data = gcs_pb2.ResourcesData(
        node_id=node.node_id,
        node_manager_address=node.node_manager_address,
        draining_deadline_timestamp_ms=-1,
    )
    # item by item: map fields given to the constructor go through the Mapping mixin's
    # update(), ~25% slower (10,000 nodes at a restart or takeover)
    total, available, totals = node.resources_total, data.resources_available, data.resources_total
    for name in total:
        available[name] = totals[name] = total[name]
    labels, data_labels = node.labels, data.labels
    for key in labels:
        data_labels[key] = labels[key]
    return NodeResources(data, 0.0)


class DemandAggregate:
    """Sum of every node's ``resource_load_by_shape`` keyed by (shape, selectors).

    Each key's serialized ``ResourceRequestByCount`` entry is cached and rebuilt only when
    that key's totals change, so the snapshot's pending section is one ``bytes.join``.
    """

    def __init__(self) -> None:
        self._totals: dict[DemandKey, list[int]] = {}
        self._request_bytes: dict[DemandKey, bytes] = {}
        self._entries: dict[DemandKey, bytes] = {}
        self._dirty: set[DemandKey] = set()
        self._joined: bytes | None = None

    def add(self, contribution: dict[DemandKey, Counts], sign: int) -> None:
        if not contribution:
            return
        self._joined = None
        for key, (ready, infeasible, backlog) in contribution.items():
            totals = self._totals.get(key)
            if totals is None:
                totals = self._totals[key] = [0, 0, 0]
            totals[0] += sign * ready
            totals[1] += sign * infeasible
            totals[2] += sign * backlog
            if totals == [0, 0, 0]:
                del self._totals[key]
            self._dirty.add(key)

    def items(self) -> Iterator[tuple[DemandKey, Counts]]:
        for key, totals in self._totals.items():
            yield key, (totals[0], totals[1], totals[2])

    def __len__(self) -> int:
        return len(self._totals)

    def _request(self, key: DemandKey) -> bytes:
        cached = self._request_bytes.get(key)
        if cached is None:
            shape, selectors = key
            request = autoscaler_pb2.ResourceRequest(resources_bundle=dict(shape))
            payload = request.SerializeToString(deterministic=True)
            payload += b"".join(len_field(3, s) for s in selectors)
            cached = self._request_bytes[key] = payload
        return cached

    def serialized_requests(self) -> bytes:
        """``ClusterResourceState.pending_resource_requests`` (field 4) entries, count > 0."""
        if self._joined is None:
            for key in self._dirty:
                totals = self._totals.get(key)
                count = sum(totals) if totals is not None else 0
                if count > 0:
                    entry = len_field(1, self._request(key)) + int_field(2, count)
                    self._entries[key] = len_field(4, entry)
                else:
                    self._entries.pop(key, None)
                    self._request_bytes.pop(key, None)
            self._dirty.clear()
            self._joined = b"".join(self._entries.values())
        return self._joined


class ResourceCache:
    """The GCS's per-node resource view (listener of NodeManager)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.nodes: dict[bytes, NodeResources] = {}
        self.demand = DemandAggregate()
        self.job_demand: dict[bytes, dict[DemandKey, int]] = {}
        """Pending requests by the job that queued them, summed over nodes: only rows that
        name their job count (a Ray raylet's rows do not); virtual clusters read it."""
        self.demand_version = 0
        """Bumped whenever some node's pending demand changes (caches key on it)."""
        self.updates = 0

    def is_idle(self, node_id: bytes) -> bool:
        """Unknown nodes are idle; otherwise the raylet says so or nothing is allocated."""
        entry = self.nodes.get(node_id)
        if entry is None:
            return True
        data = entry.data
        return data.idle_duration_ms > 0 or dict(data.resources_available) == dict(
            data.resources_total
        )

    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
        if node.node_id in self.nodes:
            return
        entry = node_entry(node)
        entry.updated_mono_s = self._clock.monotonic_s()
        self.nodes[node.node_id] = entry

    def on_nodes_loaded(
        self, nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo], prepared: Prepared
    ) -> None:
        """A hot standby's entries are adopted (its mirror built them as the rows arrived)."""
        own = self.nodes
        entries = prepared(node_entry, ((k, n) for k, n in nodes.items() if k not in own))
        now = self._clock.monotonic_s()
        for entry in entries.values():
            entry.updated_mono_s = now
        own.update(entries)

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        entry = self.nodes.pop(node.node_id, None)
        if entry is not None:
            self.demand.add(entry.demand, -1)
            _add_jobs(self.job_demand, entry.job_demand, -1)
            if entry.demand:
                self.demand_version += 1

    def apply(self, node_id: bytes, data: gcs_pb2.ResourcesData) -> bool:
        """Replace a node's view with a fresh report; False for unknown (dead) nodes."""
        entry = self.nodes.get(node_id)
        if entry is None:
            return False
        self._apply_load(entry, data)
        if not data.labels and entry.data.labels:
            data.labels.update(entry.data.labels)
        data.node_id = node_id
        old = entry.data
        if (
            dict(data.resources_available) != dict(old.resources_available)
            or dict(data.resources_total) != dict(old.resources_total)
            or data.labels != old.labels
        ):
            entry.generation += 1  # only what the cached per-node snapshot bytes depend on
        entry.data = data
        entry.updated_mono_s = self._clock.monotonic_s()
        self.updates += 1
        return True

    def _apply_load(self, entry: NodeResources, data: gcs_pb2.ResourcesData) -> None:
        """The report's pending demand replaces the node's contribution to the aggregate."""
        load_bytes = data.resource_load_by_shape.SerializeToString(deterministic=True)
        if load_bytes != entry.load_bytes:
            contribution: dict[DemandKey, Counts] = {}
            by_job: dict[bytes, dict[DemandKey, int]] = {}
            for demand in data.resource_load_by_shape.resource_demands:
                key = demand_key(demand)
                prev = contribution.get(key, (0, 0, 0))
                counts = (
                    demand.num_ready_requests_queued,
                    demand.num_infeasible_requests_queued,
                    max(demand.backlog_size, 0),
                )
                contribution[key] = (prev[0] + counts[0], prev[1] + counts[1], prev[2] + counts[2])
                if demand.job_id and sum(counts):
                    rows = by_job.setdefault(demand.job_id, {})
                    rows[key] = rows.get(key, 0) + sum(counts)
            self.demand.add(entry.demand, -1)
            self.demand.add(contribution, +1)
            _add_jobs(self.job_demand, entry.job_demand, -1)
            _add_jobs(self.job_demand, by_job, +1)
            entry.demand = contribution
            entry.job_demand = by_job
            entry.load_bytes = load_bytes
            self.demand_version += 1

    def apply_view(self, node_id: bytes, view: ray_syncer_pb2.ResourceViewSyncMessage) -> bool:
        """A syncer RESOURCE_VIEW: resources, idle and draining replace the held ones; the
        load (pending demand) stays as last polled.  False for unknown (dead) nodes.

        Takes ``view`` over (its fields other than resources and labels are cleared).  Per
        view, no Python work grows with the node's resource names: whether resources moved
        is a comparison of serialized bytes, and ``data`` is merged when read."""
        entry = self.nodes.get(node_id)
        if entry is None:
            return False
        if entry.take_view(view):
            entry.generation += 1
        entry.updated_mono_s = self._clock.monotonic_s()
        self.updates += 1
        return True

    def apply_resize(self, node_id: bytes, totals: dict[str, float]) -> None:
        entry = self.nodes.get(node_id)
        if entry is None:
            return
        data = gcs_pb2.ResourcesData()
        data.CopyFrom(entry.data)
        # availability moves with the total (the raylet kept what is in use), so the
        # autoscaler sees the new room at once rather than after the next load poll
        for name, total in totals.items():
            delta = total - data.resources_total.get(name, 0.0)
            if delta and name in data.resources_available:
                data.resources_available[name] = max(0.0, data.resources_available[name] + delta)
        data.resources_total.clear()
        data.resources_total.update(totals)
        entry.data = data
        entry.generation += 1

    def draining(self) -> list[tuple[bytes, int]]:
        return [
            (node_id, e.data.draining_deadline_timestamp_ms)
            for node_id, e in self.nodes.items()
            if e.data.is_draining
        ]
