"""InternalKV keys: injective (namespace, key) encoding; cluster identity moves to META.

Before: a key of namespace ``ns`` was stored as ``@namespace_<ns>:<key>`` and a key of the
empty namespace raw, so the empty namespace could name (and overwrite, or prefix-delete)
every other namespace's keys.  After (gcs/managers/kv.py)::

    @namespace_<escape(ns)>:<key>     escape: % -> %25, : -> %3A; empty ns -> "@namespace_:"

Old rows are read the way the old code read them: ``@namespace_<ns>:<key>`` with the
namespace up to the first ``:`` (the old bytes cannot say more), anything else an
empty-namespace key.  Most rows keep their bytes (namespaces without ``%``); the rest are
rewritten in two steps through a scratch table name so no step collides with another row.

The cluster id and session name are copied from KV (``cluster``/``ray_cluster_id``,
``session``/``session_name``) into the META table, where InternalKV cannot reach them.

The encoding is frozen here on purpose: this script must keep producing what revision 0003
meant even if the application's encoder changes later.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_MARK = b"@namespace_"
_KV = "KV"
_SCRATCH = "KV~0003"
_META = "GCS_META"
_IDENTITY = {
    b"@namespace_cluster:ray_cluster_id": b"cluster/ray_cluster_id",
    b"@namespace_session:session_name": b"cluster/session_name",
}

_kv = sa.table(
    "gcs_kv",
    sa.column("namespace", sa.String),
    sa.column("table_name", sa.String),
    sa.column("key", sa.LargeBinary),
    sa.column("value", sa.LargeBinary),
)


def new_key(old: bytes) -> bytes:
    """Where an old-layout KV key lives in the new layout."""
    if old.startswith(_MARK):
        namespace, colon, key = old[len(_MARK) :].partition(b":")
        if colon and namespace:
            escaped = namespace.replace(b"%", b"%25")  # cannot contain ":" (split there)
            return _MARK + escaped + b":" + key
    return _MARK + b":" + old


def upgrade() -> None:
    conn = op.get_bind()
    moves = []
    for namespace, raw_key in conn.execute(
        sa.select(_kv.c.namespace, _kv.c.key).where(_kv.c.table_name == _KV)
    ):
        key = bytes(raw_key)
        target = new_key(key)
        if target != key:
            moves.append({"ns": namespace, "old": key, "new": target})
    if moves:
        conn.execute(
            sa.update(_kv)
            .where(
                _kv.c.namespace == sa.bindparam("ns"),
                _kv.c.table_name == _KV,
                _kv.c.key == sa.bindparam("old"),
            )
            .values(table_name=_SCRATCH, key=sa.bindparam("new")),
            moves,
        )
        conn.execute(sa.update(_kv).where(_kv.c.table_name == _SCRATCH).values(table_name=_KV))
    for kv_key, meta_key in _IDENTITY.items():
        rows = conn.execute(
            sa.select(_kv.c.namespace, _kv.c.value).where(
                _kv.c.table_name == _KV, _kv.c.key == kv_key
            )
        ).all()
        for namespace, value in rows:
            present = conn.execute(
                sa.select(sa.func.count()).where(
                    _kv.c.namespace == namespace,
                    _kv.c.table_name == _META,
                    _kv.c.key == meta_key,
                )
            ).scalar_one()
            if not present:
                conn.execute(
                    sa.insert(_kv).values(
                        namespace=namespace, table_name=_META, key=meta_key, value=value
                    )
                )


def downgrade() -> None:
    raise NotImplementedError("the old KV layout could alias namespaces; no way back")
