"""Alembic's environment for tuner's tables: runs on the connection (in its transaction, under the schema lock) that
tuner.storage.db.upgrade hands over in ``config.attributes["connection"]``."""

from __future__ import annotations

from alembic import context

from tuner.storage.migrations import VERSION_TABLE, include_object
from tuner.storage.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("tuner's migrations run through `tuner db upgrade` (tuner.storage.db.upgrade), not alembic")

context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    include_object=include_object,
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
