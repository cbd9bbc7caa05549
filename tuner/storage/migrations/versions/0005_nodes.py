"""Searches across nodes (issue 43): the study's workers as nodes, its leader's lease, the probes posted across
nodes and each node's part of them (tuner.storage.schema, tuner.storage.nodes).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tuner_nodes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(128), nullable=False),
        sa.Column("worker", sa.String(256), nullable=False),
        sa.Column("address", sa.String(256), nullable=False),
        sa.Column("nproc", sa.Integer(), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("left_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.UniqueConstraint("study_name", "worker", name="uq_tuner_nodes_worker"),
    )
    op.create_index("ix_tuner_nodes_study_name", "tuner_nodes", ["study_name"])
    op.create_table(
        "tuner_node_leases",
        sa.Column("study_name", sa.String(128), primary_key=True),
        sa.Column("worker", sa.String(256), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
    )
    op.create_table(
        "tuner_node_probes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("study_name", sa.String(128), nullable=False),
        sa.Column("leader", sa.String(256), nullable=False),
        sa.Column("endpoint", sa.String(300), nullable=False),
        sa.Column("rdzv_id", sa.String(128), nullable=False),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("join_timeout_s", sa.Float(), nullable=False),
        sa.Column("posted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stop_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
    )
    op.create_index("ix_tuner_node_probes_study_name", "tuner_node_probes", ["study_name"])
    op.create_table(
        "tuner_node_parts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("probe_id", sa.Integer(), sa.ForeignKey("tuner_node_probes.id"), nullable=False),
        sa.Column("worker", sa.String(256), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.UniqueConstraint("probe_id", "worker", name="uq_tuner_node_parts"),
    )
    op.create_index("ix_tuner_node_parts_probe_id", "tuner_node_parts", ["probe_id"])


def downgrade() -> None:
    op.drop_index("ix_tuner_node_parts_probe_id", table_name="tuner_node_parts")
    op.drop_table("tuner_node_parts")
    op.drop_index("ix_tuner_node_probes_study_name", table_name="tuner_node_probes")
    op.drop_table("tuner_node_probes")
    op.drop_table("tuner_node_leases")
    op.drop_index("ix_tuner_nodes_study_name", table_name="tuner_nodes")
    op.drop_table("tuner_nodes")
