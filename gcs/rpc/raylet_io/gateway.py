"""What managers see of raylets: :class:`RayletGateway`, a protocol without transport types.

Managers (load poller, health checker, autoscaler state, restart notification) call raylets
only through this protocol.  Implementations raise domain errors (:mod:`gcs.base.errors`):

* :class:`~gcs.base.errors.RayletUnreachable` - the call did not get an answer (refused, lost,
  deadline exceeded);
* :class:`~gcs.base.errors.RayStatusError` - the raylet answered with a refusal Ray reports by
  its ``StatusCode`` name (invalid argument, not found, failed precondition).

``address`` is the raylet's ``host:port`` (:func:`raylet_address`).  Implementations bound
the calls in flight and the connections kept open; a call waiting for a free slot has not
been made yet, and its deadline starts only when it is sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from gcs.proto import common_pb2, gcs_pb2, node_manager_pb2


def raylet_address(node: gcs_pb2.GcsNodeInfo) -> str:
    return f"{node.node_manager_address}:{node.node_manager_port}"


class RayletGateway(Protocol):
    async def get_resource_load(
        self, node_id: bytes, address: str, timeout_s: float
    ) -> gcs_pb2.ResourcesData:
        """``NodeManagerService.GetResourceLoad``: the raylet's current ``ResourcesData``."""
        ...

    async def health_check(self, node_id: bytes, address: str, timeout_s: float) -> bool:
        """``grpc.health.v1`` Check for the node's service: True iff it answers SERVING."""
        ...

    async def drain(
        self,
        node_id: bytes,
        address: str,
        request: node_manager_pb2.DrainRayletRequest,
        timeout_s: float,
    ) -> node_manager_pb2.DrainRayletReply:
        """``DrainRaylet`` forwarded as is."""
        ...

    async def resize(
        self, node_id: bytes, address: str, resources: Mapping[str, float], timeout_s: float
    ) -> dict[str, float]:
        """``ResizeLocalResourceInstances``; returns the raylet's new totals."""
        ...

    async def notify_gcs_restart(self, node_id: bytes, address: str, timeout_s: float) -> None:
        """``NotifyGCSRestart`` (the raylet resubscribes and reports again)."""
        ...

    async def prepare_bundles(
        self, node_id: bytes, address: str, bundles: Sequence[common_pb2.Bundle], timeout_s: float
    ) -> bool:
        """``PrepareBundleResources``: True iff the raylet holds all of ``bundles`` now."""
        ...

    async def commit_bundles(
        self, node_id: bytes, address: str, bundles: Sequence[common_pb2.Bundle], timeout_s: float
    ) -> None:
        """``CommitBundleResources`` of bundles this raylet prepared."""
        ...

    async def remove_bundles(
        self,
        node_id: bytes,
        address: str,
        pg_id: bytes,
        bundles: Sequence[common_pb2.Bundle],
        timeout_s: float,
    ) -> None:
        """``RemovePlacementGroupBundles`` (Ray 2.60's cancel / return of prepared or
        committed bundles)."""
        ...

    async def release_unused_bundles(
        self,
        node_id: bytes,
        address: str,
        in_use: Sequence[common_pb2.Bundle],
        timeout_s: float,
    ) -> None:
        """``ReleaseUnusedBundles``: the raylet returns every bundle not in ``in_use``."""
        ...

    def forget(self, node_id: bytes) -> None:
        """The node is dead: close its connections and drop what is known about it."""
        ...

    async def close(self) -> None:
        """Close every connection; idempotent."""
        ...
