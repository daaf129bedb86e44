"""What the model asks the rest of the GCS about workloads (it owns no such state)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class UsageView(Protocol):
    def is_node_idle(self, node_id: str) -> bool:
        """True when the node runs nothing: no normal-task resources in use and total ==
        available in the resource view. Unknown nodes count as idle; the model treats dead
        nodes as idle without asking."""
        ...

    def has_workload(self, cluster_id: str) -> bool:
        """True while a running job, detached actor or detached placement group is registered
        in this (indivisible or job) cluster."""
        ...


@dataclass
class StaticUsage:
    """A ``UsageView`` over two sets; for tests and simple callers."""

    busy_nodes: set[str] = field(default_factory=set)
    busy_clusters: set[str] = field(default_factory=set)

    def is_node_idle(self, node_id: str) -> bool:
        return node_id not in self.busy_nodes

    def has_workload(self, cluster_id: str) -> bool:
        return cluster_id in self.busy_clusters


IDLE = StaticUsage()
