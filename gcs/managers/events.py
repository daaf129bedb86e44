"""Event fan-outs between managers: one class, :class:`Fanout`, one per kind of event.

A manager that emits (NodeManager, JobManager, PlacementGroupManager, WorkerManager) is given
its fan-out; listeners are objects with the kind's protocol methods, subscribed in one
place, the wiring (:mod:`gcs.server.wiring`), in the order the events must reach them.  No
listener subscribes itself, so that order is written down once and not an accident of
construction order; the cycles (the VC manager reads jobs and placement groups, which must
ask it about virtual clusters) need no late assignment either.

Listeners are called synchronously, in subscription order, from the emitter's apply step:
after the change is persisted and applied in memory, before it is published.  A listener
must not await; work that must (a store write, a raylet call) goes to a task of the
listener's own (:class:`~gcs.base.background.Background`).  An exception from a listener
reaches the emitter (``check_job`` refuses a job that way).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar

from gcs.proto import gcs_pb2

__all__ = [
    "Fanout",
    "JobEvents",
    "JobListener",
    "NodeDeathListener",
    "NodeEvents",
    "NodeListener",
    "PlacementGroupEvents",
    "PlacementGroupListener",
    "Prepared",
    "WorkerEvents",
    "WorkerListener",
]

L = TypeVar("L")
T = TypeVar("T")


class Fanout(Generic[L]):
    """The listeners of one kind of event, in subscription order.  An emitter tells each::

    for listener in self._node_events:
        listener.on_node_dead(node)
    """

    def __init__(self, *listeners: L) -> None:
        """``listeners``: the first ones, in order (tests wiring a few managers by hand)."""
        self._listeners: list[L] = list(listeners)

    def subscribe(self, *listeners: L) -> None:
        """Add listeners after those already subscribed (the wiring lists them in order)."""
        self._listeners.extend(listeners)

    def __iter__(self) -> Iterator[L]:
        return iter(self._listeners)


class Prepared(Protocol):
    """``prepared(view, nodes)`` -> ``{node_id: view(node)}``, each handed over from a hot
    standby's warm copy when it built that view for that very node, else computed
    (:meth:`gcs.store.Store.prepared` on the node table)."""

    def __call__(
        self,
        view: Callable[[gcs_pb2.GcsNodeInfo], T],
        nodes: Iterable[tuple[bytes, gcs_pb2.GcsNodeInfo]],
    ) -> dict[bytes, T]: ...


class NodeListener(Protocol):
    """Node added / dead, after the NODE row is persisted; at load, the alive nodes at once."""

    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None: ...

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None: ...

    def on_nodes_loaded(
        self, nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo], prepared: Prepared
    ) -> None:
        """Once, at load, before any other event: the alive nodes read from the store, as
        ``on_node_added`` for each would (10,000 nodes at a restart or a takeover: one call,
        per-node state a hot standby prepared adopted through ``prepared``)."""


class NodeDeathListener:
    """A :class:`NodeListener` that acts on deaths only: nodes added (and the alive nodes at
    load) are nothing to it.  Subclasses define :meth:`on_node_dead`."""

    __slots__ = ()

    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
        return None

    def on_nodes_loaded(
        self, nodes: Mapping[bytes, gcs_pb2.GcsNodeInfo], prepared: Prepared
    ) -> None:
        return None

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        raise NotImplementedError


class JobListener(Protocol):
    def check_job(self, job: gcs_pb2.JobTableData) -> None:
        """Before AddJob persists anything; raises ``JobRejected`` to refuse the job."""

    def on_job_finished(self, job: gcs_pb2.JobTableData) -> None: ...


class PlacementGroupListener(Protocol):
    def on_placement_group_created(self, pg: gcs_pb2.PlacementGroupTableData) -> None:
        """A new PENDING group was persisted (it wants placing)."""

    def on_placement_group_removed(
        self, pg: gcs_pb2.PlacementGroupTableData, virtual_cluster_id: str
    ) -> None: ...


class WorkerListener(Protocol):
    def on_worker_dead(self, failure: gcs_pb2.WorkerTableData) -> None:
        """A worker (or driver) process died: ``ReportWorkerFailure``'s ``worker_failure``
        (``worker_address``, ``exit_type``, ``exit_detail``, ``creation_task_exception``),
        emitted by the worker manager after it persisted the failure."""


NodeEvents = Fanout[NodeListener]
JobEvents = Fanout[JobListener]
PlacementGroupEvents = Fanout[PlacementGroupListener]
WorkerEvents = Fanout[WorkerListener]
