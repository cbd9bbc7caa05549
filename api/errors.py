"""Every error leaves the API as JSON {"detail": "one line"}: user mistakes 4xx, storage down 503, bugs 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuner.errors import StorageError, TunerError
from tuner.settings import public_url, redact_url, storage_host
from tuner.storage.read_pool import UNAVAILABLE

log = logging.getLogger("tuner.api")

STORAGE_DOWN = "storage unavailable: the database did not answer; check that it runs and retry"


def _json(status: int, detail: str, headers: dict[str, str] | None = None, **extra: object) -> JSONResponse:
    return JSONResponse({"detail": detail, **extra}, status_code=status, headers=headers)


def _location(err: dict) -> str:
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
    return ".".join(loc) or "request"


async def _tuner_error(_request: Request, exc: TunerError) -> JSONResponse:
    return _json(exc.http_status, _cut(str(exc), MAX_DETAIL))  # a message quoting a 200 KB key: cut (issue 42 §9)


async def _storage_error(request: Request, exc: StorageError) -> JSONResponse:
    """503; the storage URL in the message shown as its scheme and database name only (no user, host or port)."""
    url = request.app.state.services.settings.storage
    detail = str(exc).replace(redact_url(url), public_url(url)).replace(url, public_url(url))
    host = storage_host(url)
    if host and host in detail:  # the driver's own words name the server ("connection to server at ...")
        log.warning("storage error: %s", detail)
        detail = f"cannot reach storage {public_url(url)}: the database did not answer; the server's log has why"
    return _json(503, detail)


async def _db_error(_request: Request, exc: Exception) -> JSONResponse:
    log.warning("storage error: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return _json(503, STORAGE_DOWN)


#: a 422 lists this many invalid fields and says how many more (issue 33 §10: 30,000 bad items were a 13 MB body)
MAX_LISTED = 20
MAX_DETAIL = 2000  # characters of the one-line detail


def _cut(text: str, keep: int) -> str:
    return text if len(text) <= keep else f"{text[:keep]}..."


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    every = exc.errors()
    errors = jsonable_encoder(every[:MAX_LISTED], exclude={"url", "ctx", "input"})
    parts = [f"{_cut(_location(e), 200)}: {_cut(str(e.get('msg', 'invalid')), 200)}" for e in errors]
    more = f"; and {len(every) - MAX_LISTED:,} more invalid fields" if len(every) > MAX_LISTED else ""
    return _json(422, _cut("invalid request: " + "; ".join(parts), MAX_DETAIL) + more, errors=errors)


async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return _json(exc.status_code, _cut(detail, MAX_DETAIL), headers=getattr(exc, "headers", None))


async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error", exc_info=exc)
    return _json(500, f"internal error ({type(exc).__name__}); this is a bug in tuner, please report it")


def install(app: FastAPI) -> None:
    app.add_exception_handler(StorageError, _storage_error)  # type: ignore[arg-type]
    app.add_exception_handler(TunerError, _tuner_error)  # type: ignore[arg-type]
    for db_down in UNAVAILABLE:
        app.add_exception_handler(db_down, _db_error)
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
