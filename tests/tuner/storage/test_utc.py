"""Timestamps are UTC-aware in the column (tuner.storage.utc.UTCDateTime), on SQLite and PostgreSQL alike: an aware
value in any zone is stored as its UTC instant and read back aware in UTC; a naive one is refused (its instant is
unknown); the database's clock (Store.db_now) and the stamps it writes (runs, heartbeats) come back aware."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from tuner.storage import Store
from tuner.storage.schema import search_runs
from tuner.storage.utc import NaiveTimestamp, UTCDateTime

UTC = dt.timezone.utc
PLUS_2 = dt.timezone(dt.timedelta(hours=2))


def test_a_value_in_another_zone_is_stored_as_its_utc_instant(storage_url: str):
    store = Store(storage_url)
    deadline = dt.datetime(2026, 3, 1, 14, 30, 15, 250000, tzinfo=PLUS_2)
    run = store.start_run("s", "host:1", 60.0, deadline)
    (row,) = store.runs("s")
    assert row.id == run and row.deadline_at is not None
    assert row.deadline_at == deadline and row.deadline_at.tzinfo == UTC
    assert row.deadline_at.hour == 12  # the UTC digits, also in SQLite's text
    if store.engine.dialect.name == "sqlite":  # no zone type: the text holds the UTC digits (PostgreSQL: an instant)
        with store.engine.connect() as conn:
            raw = conn.execute(sa.select(sa.cast(search_runs.c.deadline_at, sa.String))).scalar_one()
        assert raw.startswith("2026-03-01 12:30:15")


def test_the_database_clock_and_its_stamps_come_back_aware(storage_url: str):
    store = Store(storage_url)
    before = dt.datetime.now(UTC)
    now = store.db_now()
    assert now.tzinfo == UTC and abs((now - before).total_seconds()) < 3600
    store.start_run("s", "host:1", None, None)
    (row,) = store.runs("s")
    for stamp in (row.started_at, row.heartbeat_at):
        assert stamp is not None and stamp.tzinfo == UTC and abs((stamp - now).total_seconds()) < 3600
    assert row.deadline_at is None


def test_a_naive_datetime_is_refused(storage_url: str):
    store = Store(storage_url)
    with pytest.raises(sa.exc.StatementError, match="aware datetimes") as err:
        store.start_run("s", "host:1", 60.0, dt.datetime(2026, 3, 1, 12, 0))
    assert isinstance(err.value.orig, NaiveTimestamp)
    assert store.runs("s") == []


def test_the_type_reads_naive_and_zoned_values_as_utc():
    sqlite = sa.create_engine("sqlite://").dialect
    col = UTCDateTime()
    assert col.process_result_value(dt.datetime(2026, 1, 1, 12), sqlite) == dt.datetime(2026, 1, 1, 12, tzinfo=UTC)
    zoned = dt.datetime(2026, 1, 1, 14, tzinfo=PLUS_2)
    assert col.process_result_value(zoned, sqlite) == zoned and col.process_result_value(zoned, sqlite).tzinfo == UTC
    assert col.process_bind_param(zoned, sqlite) == dt.datetime(2026, 1, 1, 12)  # SQLite: UTC digits, no offset
    assert col.process_bind_param(None, sqlite) is None and col.process_result_value(None, sqlite) is None
