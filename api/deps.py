"""What routes depend on: the storage handles (opened lazily, so the server starts and answers 503 while the database
is down) and the bearer-token check that guards every write."""

from __future__ import annotations

import hmac
import threading
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.cache import BestConfigCache
from tuner.settings import Settings
from tuner.storage import Store, optuna_storage


class Services:
    """One per app: the settings, our Store and Optuna's RDBStorage on the same URL."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._optuna: Any = None
        self.best_cache = BestConfigCache()

    def store(self) -> Store:
        if self._store is None:
            with self._lock:
                if self._store is None:
                    self._store = Store(
                        self.settings.storage
                    )  # StorageError (503) while unreachable; retried next call
        return self._store

    def optuna(self) -> Any:
        """Optuna's RDBStorage (no heartbeat: the API only reads trials)."""
        if self._optuna is None:
            self.store()  # our schema first: one clear error when the database is down
            with self._lock:
                if self._optuna is None:
                    self._optuna = optuna_storage(self.settings.storage, heartbeat_interval=None, grace_period=None)
        return self._optuna


def services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(services)]

_bearer = HTTPBearer(auto_error=False, description="TUNER_API_TOKEN of the server")


def require_token(
    svc: ServicesDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Writes need `Authorization: Bearer <TUNER_API_TOKEN>`; a server without a token refuses every write."""
    token = svc.settings.api_token
    expected = token.get_secret_value() if token is not None else ""
    if not expected:
        raise HTTPException(403, "writes are disabled on this server: start it with TUNER_API_TOKEN set to enable them")
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <TUNER_API_TOKEN>'", challenge)
    if not hmac.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise HTTPException(401, "invalid bearer token: use the server's TUNER_API_TOKEN", challenge)
