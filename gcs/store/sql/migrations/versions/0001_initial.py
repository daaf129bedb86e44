"""Create the key-value and counter tables.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gcs_kv",
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("table_name", sa.String(255), nullable=False),
        sa.Column("key", sa.LargeBinary(), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "table_name", "key", name="pk_gcs_kv"),
    )
    op.create_table(
        "gcs_counters",
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "name", name="pk_gcs_counters"),
    )


def downgrade() -> None:
    op.drop_table("gcs_counters")
    op.drop_table("gcs_kv")
