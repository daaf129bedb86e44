"""The raylet's view of indivisible virtual clusters (ant-ray's raylet-side cache).

Fed by channel 11 (``RAY_VIRTUAL_CLUSTER_CHANNEL``) full snapshots: a message whose revision
is not newer than the one held is stale and dropped -- except a removal, which carries the
cluster's last revision (removing does not bump it); ``is_removed`` deletes the cluster but
remembers its revision so a delayed older snapshot cannot resurrect it.  After a GCS restart
the owner refetches with ``GetVirtualClusters`` and replaces the view (subscribe, then
snapshot: anything published in between is newer and still applies).
"""

from __future__ import annotations

from collections.abc import Iterable

from gcs.base.changes import Changes
from gcs.proto import virtual_cluster_data_pb2

TableData = virtual_cluster_data_pb2.VirtualClusterTableData


class VirtualClusterView:
    def __init__(self) -> None:
        self.clusters: dict[str, TableData] = {}
        self._revisions: dict[str, int] = {}
        self.dropped_stale = 0
        self.changes = Changes()
        """Notified after every snapshot applied or replaced."""

    def apply(self, data: TableData) -> bool:
        """Apply one published snapshot; False if it was stale and dropped."""
        held = self._revisions.get(data.id, -1)
        removal_of_held = data.is_removed and data.revision == held and data.id in self.clusters
        if data.revision <= held and not removal_of_held:
            self.dropped_stale += 1
            return False
        self._revisions[data.id] = data.revision
        if data.is_removed:
            self.clusters.pop(data.id, None)
        else:
            copy = TableData()
            copy.CopyFrom(data)
            self.clusters[data.id] = copy
        self.changes.notify()
        return True

    def replace_all(self, snapshot: Iterable[TableData]) -> None:
        """A fresh snapshot from the GCS replaces everything (after a GCS restart)."""
        self.clusters = {}
        self._revisions = {}
        for data in snapshot:
            self.apply(data)
        self.changes.notify()

    def cluster_of(self, node_id_hex: str) -> str | None:
        """The indivisible cluster (logical or job) this node belongs to, if any."""
        for cluster_id, data in self.clusters.items():
            if node_id_hex in data.node_instances:
                return cluster_id
        return None
