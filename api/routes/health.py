"""GET /health: the process is up and the storage answers."""

from __future__ import annotations

from fastapi import APIRouter

import tuner
from api.deps import ServicesDep
from api.schemas import ErrorOut, HealthOut
from tuner.settings import redact_url

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthOut, responses={503: {"model": ErrorOut, "description": "storage down"}})
def health(svc: ServicesDep) -> HealthOut:
    svc.store().ping()
    url = redact_url(svc.settings.storage)
    return HealthOut(status="ok", storage=url, version=tuner.__version__)
