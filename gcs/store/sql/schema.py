"""SQL schema of the store, as SQLAlchemy Core tables (queries and Alembic autogenerate).

Migrations under ``migrations/versions`` are the source of truth for what exists in a
database; this module mirrors the latest revision and must be changed together with a new one.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Index, LargeBinary, MetaData, String, Table

__all__ = ["CHANGES", "COUNTERS", "KV", "LEASE", "METADATA", "VERSION_TABLE", "WRITES"]

#: Alembic's bookkeeping table, named so it cannot clash with an application's own Alembic.
VERSION_TABLE = "gcs_alembic_version"

METADATA = MetaData()

#: One row per stored key: ``table_name`` is a store table such as ``NODE`` or ``KV``.
KV = Table(
    "gcs_kv",
    METADATA,
    Column("namespace", String(255), primary_key=True),
    Column("table_name", String(255), primary_key=True),
    Column("key", LargeBinary, primary_key=True),
    Column("value", LargeBinary, nullable=False),
)

#: Durable monotonic counters (``JobCounter`` and friends).
COUNTERS = Table(
    "gcs_counters",
    METADATA,
    Column("namespace", String(255), primary_key=True),
    Column("name", String(255), primary_key=True),
    Column("value", BigInteger, nullable=False),
)

#: Recent write ids (revision 0002): one row per committed batch, written in the batch's own
#: transaction (``landed`` true), or a fence written by ``landed()`` (``landed`` false) so the
#: batch can never commit afterwards.  Rows older than the retention are pruned.
WRITES = Table(
    "gcs_writes",
    METADATA,
    Column("namespace", String(255), primary_key=True),
    Column("write_id", LargeBinary(16), primary_key=True),
    Column("at_ms", BigInteger, nullable=False),
    Column("landed", Boolean, nullable=False),
    Index("ix_gcs_writes_at_ms", "at_ms"),
)

#: The HA leader lease of a namespace (revision 0004): last epoch granted, its holder, its
#: expiry (ms, database clock), the number of the last change-stream batch.
LEASE = Table(
    "gcs_lease",
    METADATA,
    Column("namespace", String(255), primary_key=True),
    Column("holder", String(255), nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("expires_ms", BigInteger, nullable=False),
    Column("seq", BigInteger, nullable=False),
)

#: The change stream of an HA namespace (revision 0004): one row per applied batch.
CHANGES = Table(
    "gcs_changes",
    METADATA,
    Column("namespace", String(255), primary_key=True),
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("changes", LargeBinary, nullable=False),
)
