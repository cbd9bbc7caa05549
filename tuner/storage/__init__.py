"""Storage: Optuna's RDB tables plus the project's own, on one SQLAlchemy URL (sqlite embedded, PostgreSQL shared)."""

from tuner.storage.db import ensure_schema, get_engine, optuna_storage, upgrade
from tuner.storage.store import Store

__all__ = ["Store", "ensure_schema", "get_engine", "optuna_storage", "upgrade"]
