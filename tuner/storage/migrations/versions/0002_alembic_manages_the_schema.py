"""Alembic manages the schema from here on: tuner_meta's schema_version goes to 2, which tuners from before alembic
(they read only that row, and understand 1) refuse in one line ("newer than this tuner understands; upgrade tuner")
instead of writing into tables whose later revisions they do not know. It stays 2 in every later revision.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

meta = sa.table("tuner_meta", sa.column("key", sa.String), sa.column("value", sa.String))


def _set(version: str) -> None:
    op.execute(sa.delete(meta).where(meta.c.key == "schema_version"))
    op.execute(sa.insert(meta).values(key="schema_version", value=version))


def upgrade() -> None:
    _set("2")


def downgrade() -> None:
    _set("1")
