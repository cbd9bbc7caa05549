"""Engines, schema creation/upgrade and the Optuna storage, all on one SQLAlchemy URL."""

from __future__ import annotations

import random
import time
from functools import lru_cache

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, OperationalError, ProgrammingError

from tuner.errors import StorageError
from tuner.storage.schema import SCHEMA_VERSION, meta, metadata

SQLITE_BUSY_TIMEOUT_S = 60
CREATE_ATTEMPTS = 6  # processes first-using one database race on CREATE TABLE; the losers retry


def _check_url(url: str) -> sa.URL:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StorageError(
            f"storage URL {url!r} is not a SQLAlchemy URL; use e.g. sqlite:///tuner.db or "
            "postgresql+psycopg://user@host/db"
        ) from None
    try:
        parsed.get_dialect()
    except NoSuchModuleError:
        raise StorageError(
            f"storage URL {url!r}: unknown database kind {parsed.drivername!r}; use sqlite:/// or postgresql+psycopg://"
        ) from None
    return parsed


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    # WAL: the API reads while a search writes, without "database is locked".
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def engine_kwargs(url: str) -> dict:
    """Keyword arguments for create_engine — shared by our engine and Optuna's RDBStorage."""
    parsed = _check_url(url)
    if parsed.get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}}
    return {"pool_pre_ping": True, "pool_size": 10, "max_overflow": 20}


@lru_cache(maxsize=16)
def get_engine(url: str) -> Engine:
    engine = sa.create_engine(url, **engine_kwargs(url))
    if engine.dialect.name == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _unreachable(url: str, err: Exception) -> StorageError:
    safe = make_url(url).render_as_string(hide_password=True)
    first = str(getattr(err, "orig", err)).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return StorageError(f"cannot reach storage {safe}: {first}; check the URL, that the server runs, and access rights")


def schema_version(engine: Engine) -> int | None:
    insp = sa.inspect(engine)
    if not insp.has_table(meta.name):
        return None
    with engine.connect() as conn:
        row = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).first()
    return int(row[0]) if row else None


_CONCURRENT_CREATE = ("already exists", "UNIQUE constraint failed", "duplicate key")


def _created_concurrently(err: Exception) -> bool:
    """Another process (a second worker, the API) created the same table or version row between our check and ours."""
    text = str(getattr(err, "orig", err))
    return any(mark in text for mark in _CONCURRENT_CREATE)


def upgrade(url: str) -> int:
    """Creates or migrates the project's tables; returns the schema version now in place. Idempotent."""
    for attempt in range(CREATE_ATTEMPTS):
        try:
            return _upgrade(url)
        except (OperationalError, IntegrityError) as err:
            if not _created_concurrently(err) or attempt == CREATE_ATTEMPTS - 1:
                raise _unreachable(url, err) from None
            time.sleep(random.uniform(0.05, 0.5))
    raise AssertionError("unreachable")  # pragma: no cover


def _upgrade(url: str) -> int:
    engine = get_engine(url)
    try:
        found = schema_version(engine)
        if found is not None and found > SCHEMA_VERSION:
            raise StorageError(
                f"storage holds tuner schema v{found}, newer than this tuner understands (v{SCHEMA_VERSION}); "
                "upgrade tuner (pip install -U tuner) or use another storage URL"
            )
        metadata.create_all(engine)
        with engine.begin() as conn:
            if found is None:
                conn.execute(sa.insert(meta).values(key="schema_version", value=str(SCHEMA_VERSION)))
            elif found < SCHEMA_VERSION:
                conn.execute(sa.update(meta).where(meta.c.key == "schema_version").values(value=str(SCHEMA_VERSION)))
    except (OperationalError, IntegrityError) as err:
        if _created_concurrently(err):
            raise
        raise _unreachable(url, err) from None
    return SCHEMA_VERSION


def ensure_schema(url: str) -> Engine:
    """The engine for ``url`` with our schema in place (created on first use)."""
    engine = get_engine(url)
    try:
        found = schema_version(engine)
    except OperationalError as err:
        raise _unreachable(url, err) from None
    if found != SCHEMA_VERSION:
        upgrade(url)
    return engine


def optuna_storage(url: str, heartbeat_interval: int | None = 30, grace_period: int | None = 120):
    """Optuna's RDBStorage on the same URL. With a heartbeat, trials of a killed worker are failed on resume."""
    import optuna

    for attempt in range(CREATE_ATTEMPTS):
        try:
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs(url),
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
            )
        except (OperationalError, IntegrityError, ProgrammingError) as err:
            # two processes first-using one database race on Optuna's CREATE TABLEs (on PostgreSQL also its CREATE
            # TYPE: 'type "studydirection" already exists', a ProgrammingError): the loser retries
            if isinstance(err, ProgrammingError) and not _created_concurrently(err):
                raise
            if not _created_concurrently(err) or attempt == CREATE_ATTEMPTS - 1:
                raise _unreachable(url, err) from None
            time.sleep(random.uniform(0.05, 0.5))
    raise AssertionError("unreachable")  # pragma: no cover
