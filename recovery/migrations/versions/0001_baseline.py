"""Baseline: the schema the receiver's `ensure()` calls made, frozen here.

On a fresh database it creates every table. On one made by those calls (before migrations, no
`alembic_version`) it creates the tables that are missing and adds the nullable columns and
the indexes a table gained after the database was made (what `store.add_missing_columns` did);
rows stay. It also writes the row the blast-radius budget lock takes (`planning.lock_budget`),
at the time of the receiver's clock (`recovery.clock`, bound before the migration runs).

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

from recovery import clock

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# (table, index, columns, unique)
INDEXES = [
    ("goodput_actions", "ix_goodput_actions_incident", ["incident_id", "created_at"], False),
    ("goodput_actions", "ix_goodput_actions_job_state", ["job_id", "state"], False),
    ("goodput_actions", "ix_goodput_actions_state_created", ["state", "created_at"], False),
    ("goodput_audit", "ix_audit_incident", ["incident_id", "seq"], False),
    ("goodput_audit", "ix_audit_job", ["job_id", "seq"], False),
    ("goodput_audit", "ix_audit_ts", ["ts"], False),
    ("goodput_audit", "ix_audit_type", ["type", "seq"], False),
    ("goodput_node_checks", "ix_goodput_node_checks_node", ["node"], False),
    ("receiver_incidents", "ix_incident_diag", ["diagnosis_state", "diagnosis_due"], False),
    ("receiver_incidents", "ix_incident_job_state", ["job_id", "state"], False),
    ("receiver_payloads", "ix_payload_seen", ["last_seen"], False),
    ("receiver_payloads", "uq_payload_digest", ["digest"], True),
    ("receiver_diagnoses", "ix_diag_incident", ["incident_id"], False),
]


def _tables(meta: sa.MetaData) -> None:
    sa.Table(
        "goodput_accounting",
        meta,
        sa.Column("incident_id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("onset", sa.Float(), nullable=True),
        sa.Column("detected_at", sa.Float(), nullable=True),
        sa.Column("decided_at", sa.Float(), nullable=True),
        sa.Column("running_again_at", sa.Float(), nullable=True),
        sa.Column("checkpoint_at", sa.Float(), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_hours_lost", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("incident_id"),
    )
    sa.Table(
        "goodput_actions",
        meta,
        sa.Column("id", sa.String(length=80), nullable=False),
        sa.Column("incident_id", sa.String(length=64), nullable=True),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=24), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("restarts_before", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("next_attempt_at", sa.Float(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=True),
        sa.Column("lease_until", sa.Float(), nullable=True),
        sa.Column("decided_by", sa.String(length=128), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    sa.Table(
        "goodput_audit",
        meta,
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("type", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("incident_id", sa.String(length=64), nullable=True),
        sa.Column("action_id", sa.String(length=64), nullable=True),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
    )
    sa.Table(
        "goodput_audit_anchor",
        meta,
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    sa.Table(
        "goodput_audit_exports",
        meta,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("first_seq", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("last_hash", sa.String(length=64), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("destination", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    sa.Table(
        "goodput_node_checks",
        meta,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("drain_reason", sa.String(length=256), nullable=False),
        sa.Column("level", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("step", sa.String(length=256), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    sa.Table(
        "goodput_switches",
        meta,
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("value", sa.String(length=64), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("updated_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    sa.Table(
        "receiver_alerts",
        meta,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("starts_at", sa.String(length=64), nullable=False),
        sa.Column("starts_ts", sa.Float(), nullable=False),
        sa.Column("ends_ts", sa.Float(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("alertname", sa.String(length=128), nullable=False),
        sa.Column("severity", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("node", sa.String(length=64), nullable=True),
        sa.Column("gpu", sa.String(length=8), nullable=True),
        sa.Column("labels", sa.Text(), nullable=False),
        sa.Column("annotations", sa.Text(), nullable=False),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("fingerprint", "starts_at", name="uq_alert_identity"),
    )
    sa.Table(
        "receiver_incidents",
        meta,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("node", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("opened_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("resolved_at", sa.Float(), nullable=True),
        sa.Column("first_alert_ts", sa.Float(), nullable=True),
        sa.Column("outcome", sa.String(length=32), nullable=True),
        sa.Column("diagnosis_state", sa.String(length=16), nullable=False),
        sa.Column("diagnosis_due", sa.Float(), nullable=True),
        sa.Column("diagnosis_gen", sa.Integer(), nullable=False),
        sa.Column("diagnosis_attempts", sa.Integer(), nullable=False),
        sa.Column("diagnosis_owner", sa.String(length=64), nullable=True),
        sa.Column("diagnosis_lease", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    sa.Table(
        "receiver_payloads",
        meta,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.Column("group_key", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=True),
        sa.Column("deliveries", sa.Integer(), nullable=True),
        sa.Column("last_seen", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    sa.Table(
        "receiver_diagnoses",
        meta,
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("outcome", sa.String(length=32), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["receiver_incidents.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    sa.Table(
        "receiver_incident_alerts",
        meta,
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("alert_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["alert_id"],
            ["receiver_alerts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["receiver_incidents.id"],
        ),
        sa.UniqueConstraint("incident_id", "alert_id", name="uq_incident_alert"),
    )


def upgrade() -> None:
    bind = op.get_bind()
    have = set(sa.inspect(bind).get_table_names())
    meta = sa.MetaData()
    _tables(meta)
    for table in meta.sorted_tables:
        if table.name not in have:
            table.create(bind)
            continue
        present = {c["name"] for c in sa.inspect(bind).get_columns(table.name)}
        for col in table.columns:  # a NOT NULL column cannot be added to rows: none was
            if col.name not in present and col.nullable:
                op.add_column(table.name, sa.Column(col.name, col.type, nullable=True))
    for table_name, name, columns, unique in INDEXES:
        op.create_index(name, table_name, columns, unique=unique, if_not_exists=True)
    switches = meta.tables["goodput_switches"]
    if not bind.execute(sa.select(switches.c.name).where(switches.c.name == "budget")).first():
        row = {"name": "budget", "value": "lock", "updated_by": "goodput"}
        bind.execute(switches.insert().values(updated_at=clock.now(bind), **row))


def downgrade() -> None:
    raise NotImplementedError("the baseline is not undone: drop the database instead")
