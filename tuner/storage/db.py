"""Engines, schema creation and upgrade (alembic: tuner/storage/migrations) and the Optuna storage, on one URL."""

from __future__ import annotations

import os
import random
import re
import time
from functools import lru_cache
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, OperationalError, ProgrammingError
from sqlalchemy.pool import NullPool

from tuner.errors import StorageError
from tuner.settings import redact, redact_url
from tuner.storage import migrations
from tuner.storage.migrations import VERSION_TABLE
from tuner.storage.schema import claims, meta, probes, search_runs, studies

SQLITE_BUSY_TIMEOUT_S = 60
SQLITE_HEADER = b"SQLite format 3\x00"
CREATE_ATTEMPTS = 6  # processes first-using one database race on Optuna's CREATE TABLEs; the losers retry
SCHEMA_LOCK_KEY = 0x74756E6572  # "tuner": the PostgreSQL advisory lock every schema upgrade holds
# What a database made before alembic (tuner <= fb0cbe4, metadata.create_all) holds, and the revision it equals.
PRE_ALEMBIC_VERSION = "1"
PRE_ALEMBIC_REVISION = "0001"
PRE_ALEMBIC_TABLES = frozenset(t.name for t in (meta, studies, search_runs, probes, claims))


def _check_url(url: str) -> sa.URL:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StorageError(
            f"storage URL {redact_url(url)!r} is not a SQLAlchemy URL; use e.g. sqlite:///tuner.db or "
            "postgresql+psycopg://user@host/db"
        ) from None
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise StorageError(
            f"storage URL {redact_url(url)!r}: unknown database kind {parsed.drivername!r}; use sqlite:/// or "
            "postgresql+psycopg://"
        ) from None
    _check_kind(parsed, dialect, redact_url(url))
    return parsed


def _check_kind(parsed: sa.URL, dialect: type, shown: str) -> None:
    """SQLite on a file or PostgreSQL through a driver this host has (issue 24: MySQL, psycopg2 or an in-memory or
    non-SQLite file were tracebacks)."""
    use = "use sqlite:///tuner.db or postgresql+psycopg://user@host/db"
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise StorageError(
            f"storage URL {shown!r}: tuner stores in SQLite or PostgreSQL, not {parsed.drivername!r}; {use}"
        )
    try:
        dialect.import_dbapi()  # type: ignore[attr-defined]
    except ImportError:
        raise StorageError(
            f"storage URL {shown!r}: the driver of {parsed.drivername!r} is not installed here; {use}"
        ) from None
    if parsed.get_backend_name() != "sqlite":
        return
    if not parsed.database or parsed.database == ":memory:" or parsed.query.get("mode") == "memory":
        raise StorageError(f"storage URL {shown!r} is an in-memory database: nothing would be kept; {use}")
    _check_sqlite_file(Path(parsed.database).expanduser(), shown)


# Files whose header this process has read. Closing ANY descriptor of a file drops every POSIX lock the process holds
# on it (fcntl semantics), SQLite's included: reading the header again while one of this process's connections holds
# a lock let another process checkpoint under it ("disk I/O error" in tests/e2e/test_faults.py, the API reading while
# a search writes). So each file is read once per process, before this process opens a connection to it.
_HEADER_READ: set[str] = set()


def _check_sqlite_file(path: Path, shown: str) -> None:
    """An existing, non-empty file must be a SQLite database (its 16-byte header); read once per process."""
    key = os.path.realpath(path)
    if key in _HEADER_READ:
        return
    try:
        with open(path, "rb") as fh:
            header = fh.read(len(SQLITE_HEADER))
    except (FileNotFoundError, IsADirectoryError, PermissionError, NotADirectoryError):
        _HEADER_READ.add(key)  # SQLite makes it on first use, as a database: never read it again under a lock
        return  # none yet (made on first use), or SQLite's own error names it
    if header and header != SQLITE_HEADER:
        raise StorageError(f"storage {shown!r} is not a SQLite database file; give a new file name or a tuner database")
    _HEADER_READ.add(key)


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
    first = str(getattr(err, "orig", err)).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return StorageError(
        f"cannot reach storage {redact_url(url)}: {redact(first, url)}; check the URL, that the server runs, and "
        "access rights"
    )


def _revisions(conn: sa.Connection) -> tuple[str, ...]:
    """The tuner revisions stamped in the database: () before the first upgrade. (What alembic's
    MigrationContext.get_current_heads reads, without importing alembic on every first use.)"""
    if not sa.inspect(conn).has_table(VERSION_TABLE):
        return ()
    return tuple(str(r[0]) for r in conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")))


def schema_revision(engine: Engine) -> str | None:
    """The tuner schema revision of the database (e.g. "0002"), None when it has none yet (new, or made before
    alembic)."""
    with engine.connect() as conn:
        found = _revisions(conn)
    return found[0] if found else None


def current_revision(url: str) -> str | None:
    """schema_revision of ``url``, with an unreachable database as one StorageError line."""
    try:
        return schema_revision(get_engine(url))
    except OperationalError as err:
        raise _unreachable(url, err) from None


def _refuse_newer(found: tuple[str, ...]) -> None:
    unknown = sorted(set(found) - migrations.known_revisions())
    if unknown:
        raise StorageError(
            f"storage holds tuner schema revision {', '.join(unknown)}, newer than this tuner understands "
            f"(it knows up to {migrations.head()}); upgrade tuner (pip install -U tuner) or use another storage URL"
        )


_CONCURRENT_CREATE = ("already exists", "UNIQUE constraint failed", "duplicate key")


def _created_concurrently(err: Exception) -> bool:
    """Another process (a second worker, the API) created the same table or version row between our check and ours."""
    text = str(getattr(err, "orig", err))
    return any(mark in text for mark in _CONCURRENT_CREATE)


def upgrade(url: str) -> str:
    """Creates or migrates the project's tables; returns the schema revision now in place (the head). Idempotent, and
    safe when several processes first-use one database at once: each upgrade holds a database-wide lock."""
    for attempt in range(CREATE_ATTEMPTS):
        try:
            return _upgrade(url)
        except (OperationalError, IntegrityError) as err:
            if not _created_concurrently(err) or attempt == CREATE_ATTEMPTS - 1:
                raise _unreachable(url, err) from None
            time.sleep(random.uniform(0.05, 0.5))
    raise AssertionError("unreachable")  # pragma: no cover


def _migration_engine(url: str) -> Engine:
    """A one-off engine whose transaction is the upgrade, holding a lock other upgrades wait on.

    SQLite: ``BEGIN IMMEDIATE`` (with the driver's own transaction handling off, so DDL is inside it too) takes the
    database's write lock; a second process waits for it (busy timeout) and then finds the schema in place.
    PostgreSQL: DDL is transactional, and ``pg_advisory_xact_lock`` (taken first, in _lock) serialises upgrades.
    """
    kwargs = engine_kwargs(url)
    engine = sa.create_engine(url, poolclass=NullPool, connect_args=kwargs.get("connect_args", {}))
    if engine.dialect.name == "sqlite":

        def _connect(dbapi_conn, record) -> None:
            dbapi_conn.isolation_level = None
            _sqlite_pragmas(dbapi_conn, record)

        def _begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        sa.event.listen(engine, "connect", _connect)
        sa.event.listen(engine, "begin", _begin)
    return engine


def _lock(conn: sa.Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})


def _upgrade(url: str) -> str:
    engine = _migration_engine(url)
    try:
        with engine.begin() as conn:
            _lock(conn)
            _migrate(conn)
    except (OperationalError, IntegrityError) as err:
        if _created_concurrently(err):
            raise
        raise _unreachable(url, err) from None
    finally:
        engine.dispose()
    return migrations.head()


def _migrate(conn: sa.Connection) -> None:
    from alembic import command

    found = _revisions(conn)
    _refuse_newer(found)
    if not found:
        _stamp_pre_alembic(conn)
    command.upgrade(migrations.config(conn), "head")


def _stamp_pre_alembic(conn: sa.Connection) -> None:
    """A database made before alembic (metadata.create_all, tuner_meta schema_version 1) holds exactly revision
    PRE_ALEMBIC_REVISION's tables: stamp it there, so the upgrade runs only the later revisions and keeps the rows."""
    names = sa.inspect(conn).get_table_names()
    ours = {name for name in names if name.startswith(migrations.TABLE_PREFIX) and name != VERSION_TABLE}
    if not ours:
        return  # a fresh database (Optuna's tables may be there): the upgrade creates everything
    version = None
    if meta.name in ours:
        row = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).first()
        version = row[0] if row else None
    missing = sorted(PRE_ALEMBIC_TABLES - ours)
    if version not in (None, PRE_ALEMBIC_VERSION) or missing:
        what = f"schema_version {version}" if version not in (None, PRE_ALEMBIC_VERSION) else f"no {', '.join(missing)}"
        raise StorageError(
            f"storage holds tuner tables without a {VERSION_TABLE} table ({what}), not a schema tuner made; "
            "use another storage URL, or drop the tuner_* tables to start over"
        )
    from alembic import command

    command.stamp(migrations.config(conn), PRE_ALEMBIC_REVISION)


def ensure_schema(url: str) -> Engine:
    """The engine for ``url`` with our schema in place (created or upgraded on first use)."""
    engine = get_engine(url)
    found = current_revision(url)
    if found != migrations.head():
        _refuse_newer((found,) if found else ())
        upgrade(url)
    return engine


def open_for_reading(url: str) -> Engine:
    """ensure_schema for the read commands (`tuner studies`, `trials`, `best`, `export`, `report`): a database without
    tuner's tables (another program's SQLite file, an empty database) or a SQLite file that does not exist is refused
    with one StorageError line and left as it was, byte for byte; a tuner database of an older schema, or an Optuna
    storage (its studies can be reported), gets tuner's tables as on every use."""
    parsed = make_url(url) if "://" in url else None
    path = parsed.database if parsed is not None and parsed.drivername.startswith("sqlite") else None
    if path and path != ":memory:" and not Path(path).exists():
        raise StorageError(
            f"cannot reach storage {path}: the file does not exist (a read creates none); give the --storage of your "
            "studies (`tuner search` creates it)"
        )
    plain = sa.create_engine(url, **engine_kwargs(url))  # no WAL pragma: that would rewrite a SQLite file's header
    try:
        with plain.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
    except OperationalError as err:
        raise _unreachable(url, err) from None
    except sa.exc.DatabaseError:  # not a database at all: ensure_schema's one line says so
        return ensure_schema(url)
    finally:
        plain.dispose()
    if studies.name not in tables and not {"studies", "trials", "version_info"} <= tables:  # nor Optuna's own
        raise StorageError(
            f"storage {redact_url(url)} is not a tuner database (no {studies.name} table; left as it was); give the "
            "--storage of your studies (`tuner search` or `tuner db upgrade` creates tuner's tables)"
        )
    return ensure_schema(url)


def _optuna_schema(url: str, err: RuntimeError) -> Exception:
    """One line naming the optuna that wrote the storage's tables, or ``err`` itself when it is not that check."""
    import optuna

    text = str(err)
    wrote = re.search(r"set up by optuna ([^)\s]+)", text)
    if "compatible with the table schema" not in text or wrote is None:
        return err
    fix = (
        f"run `optuna storage upgrade --storage {redact_url(url)}` (a newer optuna reads it then)"
        if "storage upgrade" in text
        else f"install optuna {wrote.group(1)} or newer here, or use another storage URL"
    )
    return StorageError(
        f"storage {redact_url(url)}: its Optuna tables were written by optuna {wrote.group(1)}, which this host's "
        f"optuna {optuna.__version__} cannot read; {fix}"
    )


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
        except RuntimeError as err:  # optuna's own schema check: tables of another optuna version
            raise _optuna_schema(url, err) from None
        except (OperationalError, IntegrityError, ProgrammingError) as err:
            # two processes first-using one database race on Optuna's CREATE TABLEs (on PostgreSQL also its CREATE
            # TYPE: 'type "studydirection" already exists', a ProgrammingError): the loser retries
            if isinstance(err, ProgrammingError) and not _created_concurrently(err):
                raise
            if not _created_concurrently(err) or attempt == CREATE_ATTEMPTS - 1:
                raise _unreachable(url, err) from None
            time.sleep(random.uniform(0.05, 0.5))
    raise AssertionError("unreachable")  # pragma: no cover
