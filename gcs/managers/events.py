"""Event fan-outs between managers, created before the managers that use them.

Managers that emit (NodeManager, JobManager, PlacementGroupManager) and components that
listen take the fan-out as a constructor argument; a listener subscribes in its own
constructor (or the fan-out is built with the listeners that need nothing else).  So every
dependency is visible at construction and nothing is patched in afterwards, while the
cycles (the VC manager reads jobs and placement groups, which must ask it about virtual
clusters) need no late assignment.

Listeners are called synchronously, in subscription order, from the emitter's apply step:
after the change is persisted and applied in memory, before it is published.
"""

from __future__ import annotations

from typing import Protocol

from gcs.proto import gcs_pb2

__all__ = [
    "JobEvents",
    "JobListener",
    "NodeEvents",
    "NodeListener",
    "PlacementGroupEvents",
    "PlacementGroupListener",
    "WorkerEvents",
    "WorkerListener",
]


class NodeListener(Protocol):
    def on_node_added(self, node: gcs_pb2.GcsNodeInfo) -> None: ...

    def on_node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None: ...


class NodeEvents:
    """Node added / dead, after the NODE row is persisted (and on load, per alive node)."""

    def __init__(self, *listeners: NodeListener) -> None:
        self._listeners: list[NodeListener] = list(listeners)

    def subscribe(self, listener: NodeListener) -> None:
        self._listeners.append(listener)

    def node_added(self, node: gcs_pb2.GcsNodeInfo) -> None:
        for listener in self._listeners:
            listener.on_node_added(node)

    def node_dead(self, node: gcs_pb2.GcsNodeInfo) -> None:
        for listener in self._listeners:
            listener.on_node_dead(node)


class JobListener(Protocol):
    def check_job(self, job: gcs_pb2.JobTableData) -> None:
        """Before AddJob persists anything; raises ``JobRejected`` to refuse the job."""

    def on_job_finished(self, job: gcs_pb2.JobTableData) -> None: ...


class JobEvents:
    def __init__(self, *listeners: JobListener) -> None:
        self._listeners: list[JobListener] = list(listeners)

    def subscribe(self, listener: JobListener) -> None:
        self._listeners.append(listener)

    def check(self, job: gcs_pb2.JobTableData) -> None:
        for listener in self._listeners:
            listener.check_job(job)

    def finished(self, job: gcs_pb2.JobTableData) -> None:
        for listener in self._listeners:
            listener.on_job_finished(job)


class PlacementGroupListener(Protocol):
    def on_placement_group_created(self, pg: gcs_pb2.PlacementGroupTableData) -> None:
        """A new PENDING group was persisted (it wants placing)."""

    def on_placement_group_removed(
        self, pg: gcs_pb2.PlacementGroupTableData, virtual_cluster_id: str
    ) -> None: ...


class PlacementGroupEvents:
    def __init__(self, *listeners: PlacementGroupListener) -> None:
        self._listeners: list[PlacementGroupListener] = list(listeners)

    def subscribe(self, listener: PlacementGroupListener) -> None:
        self._listeners.append(listener)

    def created(self, pg: gcs_pb2.PlacementGroupTableData) -> None:
        for listener in self._listeners:
            listener.on_placement_group_created(pg)

    def removed(self, pg: gcs_pb2.PlacementGroupTableData, virtual_cluster_id: str) -> None:
        for listener in self._listeners:
            listener.on_placement_group_removed(pg, virtual_cluster_id)


class WorkerListener(Protocol):
    def on_worker_dead(self, failure: gcs_pb2.WorkerTableData) -> None:
        """A worker (or driver) process died: ``ReportWorkerFailure``'s ``worker_failure``
        (``worker_address``, ``exit_type``, ``exit_detail``, ``creation_task_exception``)."""


class WorkerEvents:
    """Worker deaths, emitted by whoever serves ``WorkerInfoGcsService.ReportWorkerFailure``
    after it persisted the failure (the actor manager restarts or destroys actors)."""

    def __init__(self, *listeners: WorkerListener) -> None:
        self._listeners: list[WorkerListener] = list(listeners)

    def subscribe(self, listener: WorkerListener) -> None:
        self._listeners.append(listener)

    def worker_dead(self, failure: gcs_pb2.WorkerTableData) -> None:
        for listener in self._listeners:
            listener.on_worker_dead(failure)
