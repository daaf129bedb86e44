"""High availability (``gcs serve --ha``): the leader lease and the change stream.

``gcs_lease``: one row per namespace (created by an HA store's ``open()``): the last epoch
granted (never goes backwards), its holder, when it expires (milliseconds on the
database's clock), the number of the last batch in the change stream (``seq``, dense) and
how far the stream was trimmed.  Every HA write locks this row first (fencing, and the
order of the change stream).

``gcs_changes``: one row per applied batch of an HA store: ``(namespace, seq)`` and the
batch's changes (``gcs.store.ha_parts`` encoding).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gcs_lease",
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", name="pk_gcs_lease"),
    )
    op.create_table(
        "gcs_changes",
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("changes", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "seq", name="pk_gcs_changes"),
    )


def downgrade() -> None:
    op.drop_table("gcs_changes")
    op.drop_table("gcs_lease")
