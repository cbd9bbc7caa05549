"""The storage a long-lived reader (the API server) opens: our Store, schema checked and upgraded as for any user,
reading through a bounded pool with timeouts (the search's engine, tuner.storage.db.get_engine, is sized for a
worker's writes), with the reads of Optuna's trials on the same pool (tuner.storage.trial_pages)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from tuner.storage.db import _sqlite_pragmas, engine_kwargs, get_engine
from tuner.storage.store import Store
from tuner.storage.trial_pages import TrialReads

# One reading process holds at most POOL_SIZE + MAX_OVERFLOW connections (one pool: Optuna's tables are read in SQL,
# tuner.storage.optuna_trials, without an RDBStorage of its own); a request waits POOL_TIMEOUT_S for one, then fails
# (the API answers 503); a new PostgreSQL connection gives up after CONNECT_TIMEOUT_S (unless the URL sets its own
# connect_timeout).
POOL_SIZE = 8
MAX_OVERFLOW = 4
POOL_TIMEOUT_S = 10
CONNECT_TIMEOUT_S = 5
# What a read raises when the database is down, cut off or its pool exhausted: the API answers these with 503.
UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError, PoolTimeout)


def pooled_engine(url: str) -> Engine:
    """A bounded pool with timeouts on ``url``."""
    kwargs: dict[str, Any] = dict(engine_kwargs(url))
    kwargs.update(pool_size=POOL_SIZE, max_overflow=MAX_OVERFLOW, pool_timeout=POOL_TIMEOUT_S, pool_recycle=1800)
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        kwargs["connect_args"] = {**kwargs.get("connect_args", {}), "connect_timeout": CONNECT_TIMEOUT_S}
    engine = sa.create_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def with_connect_timeout(url: str) -> str:
    """A PostgreSQL URL with connect_timeout=CONNECT_TIMEOUT_S unless it sets its own; other URLs as they are."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url  # the Store says what is wrong with it, in one line
    if parsed.get_backend_name() != "postgresql" or "connect_timeout" in parsed.query:
        return url
    return parsed.update_query_dict({"connect_timeout": str(CONNECT_TIMEOUT_S)}).render_as_string(hide_password=False)


class ReadStore(Store):
    """Our Store reading through a bounded pool; ``trials`` reads Optuna's trials on that pool."""

    def __init__(self, url: str) -> None:
        url = with_connect_timeout(url)  # the schema check's engines too: a silent server must not hang it
        super().__init__(url)
        get_engine(url).dispose()  # the connection the schema check left idle in the search's pool
        self.engine = pooled_engine(url)
        self.trials = TrialReads(self.engine)


__all__ = ["MAX_OVERFLOW", "POOL_SIZE", "UNAVAILABLE", "ReadStore", "pooled_engine", "with_connect_timeout"]
