"""Recent write ids, so an ambiguous commit can be resolved (Store.landed).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gcs_writes",
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("write_id", sa.LargeBinary(16), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("landed", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "write_id", name="pk_gcs_writes"),
    )
    op.create_index("ix_gcs_writes_at_ms", "gcs_writes", ["at_ms"])


def downgrade() -> None:
    op.drop_index("ix_gcs_writes_at_ms", table_name="gcs_writes")
    op.drop_table("gcs_writes")
