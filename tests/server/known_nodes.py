"""Nodes a restarted GCS finds in its store: registered by an earlier NodeManager."""

from __future__ import annotations

from gcs.base.clock import Clock
from gcs.managers.nodes import NodeManager
from gcs.proto import gcs_pb2
from gcs.store.base import Store


async def register_nodes(store: Store, clock: Clock, count: int) -> list[bytes]:
    """``count`` alive nodes (ids ``bytes([n]) * 28`` from 1) at 127.0.0.2:4000 + n."""
    before = NodeManager(store, clock)
    ids = [bytes([n]) * 28 for n in range(1, count + 1)]
    for n, node_id in enumerate(ids):
        await before.register(
            gcs_pb2.GcsNodeInfo(
                node_id=node_id, node_manager_address="127.0.0.2", node_manager_port=4000 + n
            )
        )
    return ids
