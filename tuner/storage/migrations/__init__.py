"""Alembic migrations of tuner's own tables (tuner_*), run programmatically: no alembic.ini on users' machines.

Optuna's RDBStorage keeps its revision in alembic's default ``alembic_version`` table of the same database; ours lives
in ``tuner_alembic_version`` (VERSION_TABLE), and our revisions touch only tuner_* tables, so the two histories never
see each other. ``tuner.storage.db.upgrade`` runs them under a database lock (first use and `tuner db upgrade`).

A new revision, for developers: ``scripts/new_migration.py "add x" sqlite:///d.db`` (autogenerate against a database
at head; outside the package, so nothing here imports tuner.storage.db back).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # alembic is imported when a migration runs, not by every `tuner` command (~0.2 s)
    from alembic.config import Config
    from alembic.script import ScriptDirectory

VERSION_TABLE = "tuner_alembic_version"
TABLE_PREFIX = "tuner_"
HERE = Path(__file__).resolve().parent
# The latest revision in versions/, so that first use can tell "at head" without loading alembic; a new revision
# changes it (test_migrations checks it against the scripts).
HEAD = "0005"


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Autogenerate looks at our tables only (Optuna's, and both version tables, are someone else's)."""
    if type_ == "table":
        return bool(name) and str(name).startswith(TABLE_PREFIX) and name != VERSION_TABLE
    return True


def config(connection: Any = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    cfg.set_main_option("path_separator", "os")
    cfg.attributes["connection"] = connection
    return cfg


@lru_cache(maxsize=1)
def script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(config())


def head() -> str:
    return HEAD


def known_revisions() -> set[str]:
    return {rev.revision for rev in script().walk_revisions()}
