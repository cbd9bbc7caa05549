"""What routes depend on: the storage handles (opened lazily, so the server starts and answers 503 while the database
is down) and the bearer-token check that guards every write."""

from __future__ import annotations

import hmac
import threading
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError

from api import trial_reads
from api.cache import StudyCache
from api.trial_counts import TrialCounts
from tuner.settings import Settings
from tuner.storage import Store
from tuner.storage.db import _sqlite_pragmas, engine_kwargs, get_engine

# One API process holds at most POOL_SIZE + MAX_OVERFLOW connections (one pool: the API reads Optuna's tables in SQL,
# api.trial_reads, without an RDBStorage of its own); a request waits POOL_TIMEOUT_S for one, then answers 503; a new
# PostgreSQL connection gives up after CONNECT_TIMEOUT_S (unless the URL sets its own connect_timeout).
POOL_SIZE = 8
MAX_OVERFLOW = 4
POOL_TIMEOUT_S = 10
CONNECT_TIMEOUT_S = 5


def api_engine(url: str) -> Engine:
    """The API's engine on ``url``: a bounded pool with timeouts (the search's engine, tuner.storage.db.get_engine,
    is sized for a worker's writes)."""
    kwargs: dict[str, Any] = dict(engine_kwargs(url))
    kwargs.update(pool_size=POOL_SIZE, max_overflow=MAX_OVERFLOW, pool_timeout=POOL_TIMEOUT_S, pool_recycle=1800)
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        kwargs["connect_args"] = {**kwargs.get("connect_args", {}), "connect_timeout": CONNECT_TIMEOUT_S}
    engine = sa.create_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_pragmas)
    return engine


class ApiStore(Store):
    """Our Store (schema checked and upgraded as for any user) reading through the API's bounded engine."""

    def __init__(self, url: str) -> None:
        url = with_connect_timeout(url)  # the schema check's engines too: a silent server must not hang it
        super().__init__(url)
        get_engine(url).dispose()  # the connection the schema check left idle in the search's pool
        self.engine = api_engine(url)


def with_connect_timeout(url: str) -> str:
    """A PostgreSQL URL with connect_timeout=CONNECT_TIMEOUT_S unless it sets its own; other URLs as they are."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url  # the Store says what is wrong with it, in one line
    if parsed.get_backend_name() != "postgresql" or "connect_timeout" in parsed.query:
        return url
    return parsed.update_query_dict({"connect_timeout": str(CONNECT_TIMEOUT_S)}).render_as_string(hide_password=False)


class Services:
    """One per app: the settings and our Store (its engine also reads Optuna's tables, api.trial_reads)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._optuna_tables = False
        self.cache = StudyCache()
        self.ranking = StudyCache(max_entries=4)  # every probe row of a study: a few studies at a time
        self.trial_counts = TrialCounts()

    def store(self) -> Store:
        if self._store is None:
            with self._lock:
                if self._store is None:
                    self._store = ApiStore(self.settings.storage)  # StorageError (503) while unreachable; retried
        return self._store

    def optuna_study_id(self, conn: sa.Connection, name: str) -> int | None:
        """The Optuna study id of ``name``; None before a worker created the Optuna study (or Optuna's tables)."""
        if not self._optuna_tables:
            if not trial_reads.has_optuna_tables(conn):
                return None
            self._optuna_tables = True
        return trial_reads.study_id(conn, name)


def services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(services)]

_bearer = HTTPBearer(auto_error=False, description="TUNER_API_TOKEN of the server")


def token_problem(settings: Settings, authorization: str | None) -> tuple[int, str, dict[str, str]] | None:
    """Why a request with this Authorization header may not write: (status, one line, headers); None when it may.
    Read by api.guard before the body, and by require_token (the OpenAPI security of the write routes)."""
    token = settings.api_token
    expected = token.get_secret_value() if token is not None else ""
    if not expected:
        return 403, "writes are disabled on this server: start it with TUNER_API_TOKEN set to enable them", {}
    challenge = {"WWW-Authenticate": "Bearer"}
    scheme, _, given = (authorization or "").partition(" ")
    if not authorization or scheme.lower() != "bearer" or not given.strip():
        return 401, "missing bearer token: send 'Authorization: Bearer <TUNER_API_TOKEN>'", challenge
    if not hmac.compare_digest(given.strip().encode(), expected.encode()):
        return 401, "invalid bearer token: use the server's TUNER_API_TOKEN", challenge
    return None


def require_token(
    svc: ServicesDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Writes need `Authorization: Bearer <TUNER_API_TOKEN>`; a server without a token refuses every write."""
    header = f"Bearer {credentials.credentials}" if credentials is not None else None
    problem = token_problem(svc.settings, header)
    if problem is not None:
        status, detail, headers = problem
        raise HTTPException(status, detail, headers or None)
