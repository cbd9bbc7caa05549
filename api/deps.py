"""What routes depend on: the storage handles (opened lazily, so the server starts and answers 503 while the database
is down) and the bearer-token check that guards every write."""

from __future__ import annotations

import hmac
import threading
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.cache import StudyCache
from tuner.settings import Settings
from tuner.storage.read_pool import ReadStore


class Services:
    """One per app: the settings and our Store (a bounded pool that also reads Optuna's trials:
    tuner.storage.read_pool)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._store: ReadStore | None = None
        self.cache = StudyCache()
        self.ranking = StudyCache(max_entries=4)  # every probe row of a study: a few studies at a time

    def store(self) -> ReadStore:
        if self._store is None:
            with self._lock:
                if self._store is None:
                    self._store = ReadStore(self.settings.storage)  # StorageError (503) while unreachable; retried
        return self._store


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
