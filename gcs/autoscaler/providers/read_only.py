"""``read-only`` provider: reports the Ray nodes the GCS lists, never scales.

Each alive node is a cloud instance whose id is its Ray node id (hex), as Ray's
ReadOnlyProvider does; the reconciler then mirrors them and reports demand, but launches
and terminations are never carried out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gcs.autoscaler.gcs_api import ClusterStateSource
from gcs.autoscaler.providers.base import (
    Capabilities,
    CloudInstance,
    CloudUnavailable,
    ProviderContext,
    ProviderError,
)
from gcs.base.errors import Unavailable
from gcs.policy.autoscaling.model import HEAD_RESOURCE, NodeKind
from gcs.proto import autoscaler_pb2

_ALIVE = (autoscaler_pb2.RUNNING, autoscaler_pb2.IDLE, autoscaler_pb2.DRAINING)


class ReadOnlyProvider:
    capabilities = Capabilities(read_only=True)

    def __init__(self, gcs: ClusterStateSource) -> None:
        self._gcs = gcs

    async def get_non_terminated(self) -> Mapping[str, CloudInstance]:
        try:
            state = await self._gcs.get_cluster_resource_state()
        except Unavailable as err:
            raise CloudUnavailable(f"read-only provider: {err}") from err
        out = {}
        for ns in state.node_states:
            if ns.status not in _ALIVE:
                continue
            cid = ns.node_id.hex()
            kind = NodeKind.HEAD if HEAD_RESOURCE in ns.total_resources else NodeKind.WORKER
            out[cid] = CloudInstance(cid, ns.ray_node_type_name, kind, True)
        return out

    async def launch(self, shape: Mapping[str, int], request_id: str) -> None:
        return None

    async def terminate(self, cloud_instance_ids: Sequence[str], request_id: str) -> None:
        return None

    def poll_errors(self) -> list[ProviderError]:
        return []


def build(context: ProviderContext) -> ReadOnlyProvider:
    return ReadOnlyProvider(context.gcs)
