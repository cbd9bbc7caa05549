"""Which storage errors are a lost connection (wait and retry) and which are not (stop the search). Pure.

Only connection loss is worth waiting for: the server restarting or failing over, the network cut, the pool empty
for a while, SQLite's write lock held by another process past its busy timeout. Everything else (a read-only
standby, a full disk, a read-only SQLite file, a missing table, a constraint nobody expected) will fail the same way
on every retry, so retrying it only burns the budget while measurements go unrecorded.

The chain is walked (``orig``, ``__cause__``, ``__context__``): Optuna wraps SQLAlchemy's errors in
StorageInternalError, SQLAlchemy wraps the driver's, and tuner.storage's one-line StorageError keeps the driver's
error as its context.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy.exc import DBAPIError, InvalidatePoolError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from tuner.errors import StorageError

# SQLSTATE classes of a lost connection: 08 connection exception; 57P01-57P03 admin/crash shutdown, cannot connect
# now (a server restarting or a standby being promoted)
LOST_SQLSTATE_PREFIXES = ("08", "57P0")
# SQLite: another process holds the write lock past the busy timeout; it lets go
SQLITE_TRANSIENT = ("database is locked", "database table is locked")


class StorageStopped(StorageError):
    """The search stops on a storage error (refused, or away past patience): final, never retried."""


def chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and every error it wraps, outermost first (each once)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__


def sqlstate(err: BaseException) -> str | None:
    """The SQLSTATE of the innermost driver error that has one (psycopg's ``sqlstate``, psycopg2's ``pgcode``)."""
    for inner in chain(err):
        code = getattr(inner, "sqlstate", None) or getattr(inner, "pgcode", None)
        if isinstance(code, str) and code:
            return code
    return None


def is_connection_loss(err: BaseException) -> bool:
    """True when waiting may cure ``err``: the connection was lost or could not be had (see the module doc).

    In order: our own final stop is never retried; an error with no database layer in its chain is not ours to wait
    for; SQLAlchemy's pool and invalidation say so outright; a SQLSTATE decides by its class; a driver error without
    one decides by what it is (``_driver_says_lost``)."""
    if isinstance(err, StorageStopped):
        return False
    errors = list(chain(err))
    if not any(isinstance(e, (SQLAlchemyError, ConnectionError, OSError)) or _is_driver_error(e) for e in errors):
        return False
    if any(_lost_outright(e) for e in errors):
        return True
    code = sqlstate(err)
    if code is not None:
        return code.startswith(LOST_SQLSTATE_PREFIXES)
    driver = next((e for e in errors if _is_driver_error(e)), None)  # the outermost driver error decides
    return driver is not None and _driver_says_lost(driver)


def _lost_outright(err: BaseException) -> bool:
    """The pool timed out or was invalidated, SQLAlchemy invalidated the connection, or the OS says it is gone."""
    if isinstance(err, (PoolTimeout, InvalidatePoolError, ConnectionError)):
        return True
    return isinstance(err, DBAPIError) and bool(err.connection_invalidated)


def _driver_says_lost(err: BaseException) -> bool:
    """A driver error without a SQLSTATE: psycopg's own OperationalError (connection refused, the server closed the
    connection), SQLite's lock held past the busy timeout."""
    module = type(err).__module__
    if module.startswith("psycopg"):
        return type(err).__name__ == "OperationalError"
    return module.startswith("sqlite3") and any(mark in str(err) for mark in SQLITE_TRANSIENT)


def _is_driver_error(err: BaseException) -> bool:
    """A DB-API driver's own exception (psycopg, sqlite3)."""
    return type(err).__module__.split(".")[0] in ("psycopg", "psycopg2", "sqlite3")


def first_line(err: BaseException) -> str:
    """The innermost error's first line: what the database itself said."""
    root = list(chain(err))[-1]
    return (str(root).strip().splitlines() or [type(root).__name__])[0]


__all__ = ["StorageStopped", "chain", "first_line", "is_connection_loss", "sqlstate"]
