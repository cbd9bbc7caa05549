"""Probe rows get an index on (study_name, trial_number): a page of trials (GET /studies/{name}/trials) reads the rows
of its 50 trials, which without it scanned every row of the study (9 ms of a page on a 10,000-trial study).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_tuner_probes_study_trial", "tuner_probes", ["study_name", "trial_number"])


def downgrade() -> None:
    op.drop_index("ix_tuner_probes_study_trial", table_name="tuner_probes")
