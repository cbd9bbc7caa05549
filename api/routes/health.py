"""GET /health: the process is up and the storage answers."""

from __future__ import annotations

from fastapi import APIRouter

import tuner
from api.deps import ServicesDep
from api.schemas import ErrorOut, HealthOut
from tuner.errors import StorageError
from tuner.settings import public_url, sqlite_file

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthOut, responses={503: {"model": ErrorOut, "description": "storage down"}})
def health(svc: ServicesDep) -> HealthOut:
    """Up, the storage answering; the storage shown as its scheme and database name only (this route needs no
    token). A SQLite file deleted or moved under the running server is noticed: its open connections would go on
    answering from the deleted file, and a new one would make an empty database in its place."""
    url = svc.settings.storage
    gone = sqlite_file(url)
    if gone is not None and not gone.exists():
        raise StorageError(f"storage {public_url(url)} is gone: its file was deleted or moved; restore it and restart")
    svc.store().ping()
    return HealthOut(status="ok", storage=public_url(url), version=tuner.__version__)
