"""Cluster identity: the cluster id and session name, created once and persisted in KV.

Ray keeps them at KV ``cluster``/``ray_cluster_id`` (28 raw bytes) and ``session``/
``session_name``; ``cluster``/``CLUSTER_METADATA`` carries the Ray version clients check.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import gcs
from gcs.ids import CLUSTER_ID_SIZE
from gcs.managers.kv import KvManager
from gcs.store import StoreCorrupt


@dataclass(frozen=True, slots=True)
class ClusterMeta:
    cluster_id: bytes
    session_name: str
    created: bool
    """True when this start generated the id (a fresh cluster)."""

    @property
    def cluster_id_hex(self) -> str:
        return self.cluster_id.hex()


async def load_or_create(kv: KvManager, *, session_name: str = "") -> ClusterMeta:
    existing = await kv.get(b"cluster", b"ray_cluster_id")
    created = existing is None
    if existing is not None and len(existing) != CLUSTER_ID_SIZE:
        raise StoreCorrupt(f"stored cluster id has {len(existing)} bytes, expected 28")
    cluster_id = existing or os.urandom(CLUSTER_ID_SIZE)
    if created:
        # put-if-absent: two servers racing on one namespace end up with one id.
        await kv.put(b"cluster", b"ray_cluster_id", cluster_id, overwrite=False)
        cluster_id = await kv.get(b"cluster", b"ray_cluster_id") or cluster_id
    stored_session = await kv.get(b"session", b"session_name")
    if stored_session is None:
        name = session_name or time.strftime("session_%Y-%m-%d_%H-%M-%S_") + str(os.getpid())
        await kv.put(b"session", b"session_name", name.encode(), overwrite=False)
        stored_session = await kv.get(b"session", b"session_name") or name.encode()
    metadata = json.dumps({"ray_version": gcs.RAY_VERSION, "python_version": "3.11"}).encode()
    await kv.put(b"cluster", b"CLUSTER_METADATA", metadata, overwrite=False)
    await kv.put(b"__autoscaler", b"__autoscaler_v2_enabled", b"1", overwrite=True)
    return ClusterMeta(cluster_id, stored_session.decode(), created)
