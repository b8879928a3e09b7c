"""An alert's incidents by alert: each status change of an alert looks them up, which without
this index scanned the whole link table (never pruned) under the ingest lock.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-07
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_incident_alerts_alert", "receiver_incident_alerts", ["alert_id"])


def downgrade() -> None:
    op.drop_index("ix_incident_alerts_alert", table_name="receiver_incident_alerts")
