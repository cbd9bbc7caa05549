"""Probe rows get an idempotency key (``record_uid``, unique where set): a worker writes each finished probe to its
local journal first (tuner.storage.journal) and replays unstored entries on resume, so a row whose INSERT committed
but whose answer was lost (a connection cut at that instant) is not stored twice. Rows from before keep NULL.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tuner_probes", sa.Column("record_uid", sa.String(36), nullable=True))
    op.create_index("uq_tuner_probes_record_uid", "tuner_probes", ["record_uid"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_tuner_probes_record_uid", table_name="tuner_probes")
    with op.batch_alter_table("tuner_probes") as batch:
        batch.drop_column("record_uid")
