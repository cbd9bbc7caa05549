"""The app factory: ``create_app(settings)`` builds the FastAPI service over one storage URL. Never imports torch."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

import tuner
from api import errors
from api.deps import Services
from api.guard import RequestGuard
from api.routes import router
from tuner.hosts import answered_hosts
from tuner.settings import Settings, load_settings

DESCRIPTION = (
    "Reads a tuner storage (Optuna's tables + tuner's probe rows) and serves the fastest stable training config of "
    "each study. Writes need `Authorization: Bearer $TUNER_API_TOKEN`."
)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app over ``settings`` (default: the environment's; a bad TUNER_* value raises SettingsError, one line,
    before any request: `tuner serve` prints it and exits 2)."""
    settings = settings or load_settings()
    # /docs and /redoc load Swagger UI and ReDoc from the package (/static-offline-docs), not a CDN: an air-gapped
    # GPU cluster has none
    app: FastAPI = FastAPIOffline(title="tuner", version=tuner.__version__, description=DESCRIPTION)
    app.state.services = Services(settings)
    app.state.answered_hosts = answered_hosts(settings.allowed_hosts)  # None: any (`tuner serve` fills its default)
    errors.install(app)
    app.include_router(router)
    app.add_middleware(RequestGuard)  # token, then body size, before a byte of the body is read
    return app
