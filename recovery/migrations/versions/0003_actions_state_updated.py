"""Actions by state and last change: the blast-radius budget counts executed drains by when they
ran (`recovery.planning._history`).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-07
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_goodput_actions_state_updated", "goodput_actions", ["state", "updated_at"])


def downgrade() -> None:
    op.drop_index("ix_goodput_actions_state_updated", table_name="goodput_actions")
