"""The tables tuner made with metadata.create_all before alembic (commit fb0cbe4, tuner_meta schema_version 1).

A database made by that code is stamped at this revision without running it (tuner.storage.db._stamp_legacy).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    meta = op.create_table(
        "tuner_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False),
    )
    op.create_table(
        "tuner_studies",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("definition", sa.JSON, nullable=False),
        sa.Column("created_by", sa.String(32), nullable=False),
    )
    op.create_table(
        "tuner_search_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(128), nullable=False),
        sa.Column("worker", sa.String(256), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("budget_s", sa.Float, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=True),
    )
    op.create_index("ix_tuner_search_runs_study_name", "tuner_search_runs", ["study_name"])
    op.create_table(
        "tuner_claims",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(128), nullable=False),
        sa.Column("config_key", sa.String(64), nullable=False),
        sa.Column("fidelity", sa.String(16), nullable=False),
        sa.Column("trial_number", sa.Integer, nullable=True),
        sa.Column("worker", sa.String(256), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("study_name", "config_key", "fidelity", name="uq_claim"),
    )
    op.create_table(
        "tuner_probes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(128), nullable=False),
        sa.Column("trial_number", sa.Integer, nullable=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("tuner_search_runs.id"), nullable=True),
        sa.Column("fidelity", sa.String(16), nullable=False),
        sa.Column("config_key", sa.String(64), nullable=False),
        sa.Column("knobs", sa.JSON, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("cause", sa.Text, nullable=True),
        sa.Column("samples_per_s", sa.Float, nullable=True),
        sa.Column("tokens_per_s", sa.Float, nullable=True),
        sa.Column("objective", sa.Float, nullable=True),
        sa.Column("peak_allocated", sa.BigInteger, nullable=True),
        sa.Column("peak_reserved", sa.BigInteger, nullable=True),
        sa.Column("capacity", sa.BigInteger, nullable=True),
        sa.Column("alloc_retries", sa.Integer, nullable=True),
        sa.Column("stable", sa.Boolean, nullable=False),
        sa.Column("estimate_bytes", sa.BigInteger, nullable=True),
        sa.Column("probe_seconds", sa.Float, nullable=True),
        sa.Column("setup_s", sa.Float, nullable=True),
        sa.Column("result", sa.JSON, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_tuner_probes_study_name", "tuner_probes", ["study_name"])
    op.create_index("ix_tuner_probes_config_key", "tuner_probes", ["config_key"])
    op.bulk_insert(meta, [{"key": "schema_version", "value": "1"}])


def downgrade() -> None:
    for table in ("tuner_probes", "tuner_claims", "tuner_search_runs", "tuner_studies", "tuner_meta"):
        op.drop_table(table)
