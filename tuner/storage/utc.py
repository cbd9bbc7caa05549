"""One column type for every timestamp of tuner's tables: stored as UTC, read back as an aware UTC datetime.

SQLite has no time-zone type: SQLAlchemy's DateTime writes the wall-clock digits of whatever it is given (an aware
datetime in +02:00 loses its offset) and hands back naive values. PostgreSQL's ``timestamptz`` keeps the instant
and hands back aware values in the session's zone. This type makes both behave the same: a value is converted to UTC
before it is written, and every value read (also the database clock, tuner.storage.store.db_time, in SQLite's text)
comes back aware in UTC, so no reader has to guess what a naive value meant."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import DateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


class NaiveTimestamp(ValueError):
    """A naive datetime was handed to storage: its instant is unknown (pass an aware one, e.g. datetime.now(UTC))."""


class UTCDateTime(TypeDecorator[dt.datetime]):
    """``DateTime(timezone=True)`` in the database; aware UTC datetimes in Python, both ways."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if not isinstance(value, dt.datetime) or value.tzinfo is None:
            raise NaiveTimestamp(f"storage takes aware datetimes (its columns hold UTC); got {value!r}")
        utc = value.astimezone(dt.timezone.utc)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: Any, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


__all__ = ["NaiveTimestamp", "UTCDateTime"]
