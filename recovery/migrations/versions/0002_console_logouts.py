"""Console logouts: the sessions a person ended (`recovery.console.logouts`).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "goodput_console_logouts",
        sa.Column("sid", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("sid"),
    )


def downgrade() -> None:
    op.drop_table("goodput_console_logouts")
