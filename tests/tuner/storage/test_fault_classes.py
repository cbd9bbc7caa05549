"""Which storage errors are a lost connection (wait and retry) and which stop the search (tuner.storage.faults), every
branch, in milliseconds: real errors from SQLite, SQLAlchemy's pool and a refused PostgreSQL connection, and
psycopg's own error classes wrapped as SQLAlchemy and Optuna wrap them."""

from __future__ import annotations

import errno
import sqlite3
from collections.abc import Callable
from pathlib import Path

import psycopg
import psycopg.errors
import pytest
import sqlalchemy as sa
from optuna.exceptions import StorageInternalError
from sqlalchemy.exc import DBAPIError, IntegrityError, InvalidatePoolError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import QueuePool

from trials.contract import free_port
from tuner.errors import StorageError
from tuner.storage.faults import StorageStopped, chain, first_line, is_connection_loss, sqlstate


def _raised(make: Callable[[], object]) -> BaseException:
    try:
        make()
    except BaseException as err:
        return err
    raise AssertionError("no error raised")


def _wrapped(orig: BaseException) -> DBAPIError:
    """``orig`` as SQLAlchemy raises it from a statement (its ``orig`` and ``__cause__``)."""
    try:
        raise DBAPIError.instance("SELECT 1", {}, orig, psycopg.Error) from orig
    except DBAPIError as err:
        return err


def _optuna(err: BaseException) -> StorageInternalError:
    """``err`` as Optuna's RDB storage re-raises it."""
    try:
        raise StorageInternalError("An exception is raised during the commit.") from err
    except StorageInternalError as outer:
        return outer


def test_sqlites_lock_held_past_the_busy_timeout_is_waited_for_and_a_missing_table_is_not(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    holder = sa.create_engine(url)
    with holder.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE t (k INTEGER PRIMARY KEY)")
        conn.commit()
    other = sa.create_engine(url, connect_args={"timeout": 0})
    with holder.connect() as held:
        held.exec_driver_sql("BEGIN EXCLUSIVE")
        with other.connect() as conn:
            locked = _raised(lambda: conn.exec_driver_sql("INSERT INTO t VALUES (1)"))
        held.exec_driver_sql("ROLLBACK")
    assert isinstance(locked, OperationalError) and "database is locked" in str(locked)
    assert is_connection_loss(locked) and is_connection_loss(_optuna(locked))
    with other.connect() as conn:
        missing = _raised(lambda: conn.exec_driver_sql("SELECT * FROM no_such_table"))
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        conn.commit()
        duplicate = _raised(lambda: conn.exec_driver_sql("INSERT INTO t VALUES (1)"))
    assert isinstance(missing, OperationalError) and not is_connection_loss(missing)
    assert isinstance(duplicate, IntegrityError) and not is_connection_loss(duplicate)
    assert first_line(_optuna(missing)) == "no such table: no_such_table"  # what the database itself said


def test_an_empty_pool_and_an_invalidated_connection_are_waited_for(tmp_path: Path) -> None:
    engine = sa.create_engine(
        f"sqlite:///{tmp_path / 'db.sqlite'}", poolclass=QueuePool, pool_size=1, max_overflow=0, pool_timeout=0.05
    )
    with engine.connect():
        empty = _raised(engine.connect)
    assert isinstance(empty, PoolTimeout) and is_connection_loss(empty)
    assert is_connection_loss(InvalidatePoolError("the pool was invalidated"))
    orig = sqlite3.OperationalError("disk I/O error")
    invalidated = OperationalError("SELECT 1", {}, orig, connection_invalidated=True)
    assert is_connection_loss(invalidated)
    assert not is_connection_loss(OperationalError("SELECT 1", {}, orig))  # the same error, connection kept: no


def test_a_refused_postgresql_connection_is_waited_for() -> None:
    """A server restarting: nothing listens on the port. psycopg's own OperationalError, no SQLSTATE."""
    url = f"postgresql+psycopg://tuner@127.0.0.1:{free_port()}/tuner?connect_timeout=2"
    refused = _raised(sa.create_engine(url).connect)
    assert isinstance(refused, OperationalError) and sqlstate(refused) is None
    assert is_connection_loss(refused) and is_connection_loss(_optuna(refused))
    driver = _raised(lambda: psycopg.connect(f"host=127.0.0.1 port={free_port()} connect_timeout=2"))
    assert isinstance(driver, psycopg.OperationalError) and is_connection_loss(driver)
    assert not is_connection_loss(psycopg.InterfaceError("the connection is closed by the client"))


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),  # 57P01
        (psycopg.errors.CannotConnectNow("the database system is starting up"), True),  # 57P03
        (psycopg.errors.ConnectionFailure("connection failure"), True),  # 08006
        (psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"), False),  # 25006
        (psycopg.errors.DiskFull("could not extend file: No space left on device"), False),  # 53100
        (psycopg.errors.UndefinedTable('relation "probes" does not exist'), False),  # 42P01
        (psycopg.errors.UniqueViolation("duplicate key value violates unique constraint"), False),  # 23505
    ],
)
def test_a_sqlstate_decides_by_its_class(error: psycopg.Error, lost: bool) -> None:
    assert sqlstate(_wrapped(error)) == error.sqlstate
    assert is_connection_loss(_wrapped(error)) is lost
    assert is_connection_loss(_optuna(_wrapped(error))) is lost


def test_psycopg2s_pgcode_is_a_sqlstate_too() -> None:
    """psycopg2 (not installed here) names the SQLSTATE ``pgcode``; an error carrying one is read the same way."""

    class Psycopg2Error(Exception):
        pgcode = "08001"

    Psycopg2Error.__module__ = "psycopg2.errors"
    assert sqlstate(Psycopg2Error()) == "08001" and is_connection_loss(Psycopg2Error())


def test_what_is_not_a_database_error_or_is_our_own_stop_is_never_waited_for() -> None:
    assert not is_connection_loss(ValueError("bad input"))
    assert not is_connection_loss(OSError(errno.ENOSPC, "No space left on device"))  # a full disk stays full
    assert is_connection_loss(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"))
    lost = _wrapped(psycopg.errors.AdminShutdown("terminating connection"))
    try:
        raise StorageStopped("storage refused the search's write") from lost
    except StorageStopped as stopped:
        assert not is_connection_loss(stopped)  # final: never retried, whatever it wraps
    assert not is_connection_loss(SQLAlchemyError("a mapping error, no driver below"))


def test_the_chain_is_walked_once_through_orig_cause_and_context() -> None:
    orig = psycopg.errors.AdminShutdown("terminating connection due to administrator command\nDETAIL: more")
    wrapped = _wrapped(orig)
    try:
        try:
            raise _optuna(wrapped)
        except StorageInternalError:
            raise StorageError("the storage at postgresql://... is unreachable") from None
    except StorageError as ours:  # `from None` hides the chain from a traceback only: __context__ still holds it
        assert is_connection_loss(ours)
        assert first_line(ours) == "terminating connection due to administrator command"
    a, b = ValueError("a"), KeyError("b")
    a.__context__, b.__context__ = b, a  # a cycle ends: each error once
    assert list(chain(a)) == [a, b]
    assert first_line(RuntimeError()) == "RuntimeError"  # no message: its type
