"""Cluster identity: the cluster id and session name, created once and persisted.

The authoritative copies live in the store's META table (``META_CLUSTER_ID``,
``META_SESSION_NAME``), which InternalKV cannot reach, so no client can change the identity
of the cluster.  Ray's clients read them from KV (``cluster``/``ray_cluster_id``,
``session``/``session_name``), so each start publishes copies there; ``cluster``/
``CLUSTER_METADATA`` carries the Ray version clients check.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

import gcs
from gcs.base.ids import CLUSTER_ID_SIZE
from gcs.managers.kv import KvManager
from gcs.store import Store, StoreConflict, StoreCorrupt, WriteBatch
from gcs.store.base import META_CLUSTER_ID, META_SESSION_NAME, TABLE_META
from gcs.store.outcome import write_definite


@dataclass(frozen=True, slots=True)
class ClusterMeta:
    cluster_id: bytes
    session_name: str
    created: bool
    """True when this start generated the id (a fresh cluster)."""

    @property
    def cluster_id_hex(self) -> str:
        return self.cluster_id.hex()


async def _create_once(store: Store, key: bytes, fresh: bytes) -> tuple[bytes, bool]:
    """The stored value of META ``key``, writing ``fresh`` if absent (two servers racing on
    one namespace end up with one value).  Returns (value, created)."""
    existing = await store.get(TABLE_META, key)
    if existing is not None:
        return existing, False
    try:
        await write_definite(
            store, WriteBatch().put(TABLE_META, key, fresh).expect(TABLE_META, key, None)
        )
    except StoreConflict:
        stored = await store.get(TABLE_META, key)
        if stored is None:
            raise StoreCorrupt(f"META {key!r} vanished while being created") from None
        return stored, False
    return fresh, True


def interpreter_version() -> str:
    """This interpreter's full version, as Ray writes it (``3.11.7``)."""
    return ".".join(map(str, sys.version_info[:3]))


def cluster_metadata(python_version: str = "") -> bytes:
    """``cluster``/``CLUSTER_METADATA``: Ray's workers and drivers compare both versions
    with their own (the Python one to the patch level by default) and refuse to start on a
    mismatch."""
    return json.dumps(
        {
            "ray_version": gcs.RAY_VERSION,
            "python_version": python_version or interpreter_version(),
            "ray_init_cluster": False,
        }
    ).encode()


async def stored_cluster_id(store: Store) -> tuple[bytes, bool]:
    """The store's cluster id, created if absent (the store's identity whatever URL reaches
    it); and whether this call created it."""
    return await _create_once(store, META_CLUSTER_ID, os.urandom(CLUSTER_ID_SIZE))


async def load_or_create(
    store: Store, kv: KvManager, *, session_name: str = "", python_version: str = ""
) -> ClusterMeta:
    cluster_id, created = await stored_cluster_id(store)
    if len(cluster_id) != CLUSTER_ID_SIZE:
        raise StoreCorrupt(f"stored cluster id has {len(cluster_id)} bytes, expected 28")
    name = session_name or time.strftime("session_%Y-%m-%d_%H-%M-%S_") + str(os.getpid())
    stored_session, _ = await _create_once(store, META_SESSION_NAME, name.encode())
    # Published copies for Ray's clients, rewritten each start (a client may have changed
    # them; the configured Python version may have changed), in one write
    await kv.publish(
        [
            (b"cluster", b"ray_cluster_id", cluster_id),
            (b"session", b"session_name", stored_session),
            (b"cluster", b"CLUSTER_METADATA", cluster_metadata(python_version)),
            (b"__autoscaler", b"__autoscaler_v2_enabled", b"1"),
        ]
    )
    return ClusterMeta(cluster_id, stored_session.decode(), created)


class ClusterIdentity:
    """The cluster's identity as a component: :meth:`load` reads it, or creates it on a
    fresh store; parts built before that (servicers, the autoscaler snapshot) read it after.
    """

    name = "cluster_identity"

    def __init__(
        self, store: Store, kv: KvManager, *, session_name: str = "", python_version: str = ""
    ) -> None:
        self._store = store
        self._kv = kv
        self._session_name = session_name
        self._python_version = python_version
        self._meta: ClusterMeta | None = None

    @property
    def meta(self) -> ClusterMeta:
        if self._meta is None:
            raise RuntimeError("the cluster identity is read once loaded")
        return self._meta

    @property
    def loaded(self) -> bool:
        return self._meta is not None

    def session_name(self) -> str:
        return self.meta.session_name

    async def load(self) -> None:
        self._meta = await load_or_create(
            self._store,
            self._kv,
            session_name=self._session_name,
            python_version=self._python_version,
        )

    async def run(self) -> None:
        return None

    async def close(self) -> None:
        return None
