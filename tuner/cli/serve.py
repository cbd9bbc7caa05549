"""`tuner serve`: the HTTP API (api/) under uvicorn. Loopback by default; another interface needs a token."""

from __future__ import annotations

import ipaddress
from typing import Annotated

import typer

from tuner.cli.app import app
from tuner.errors import ConfigError
from tuner.settings import load_settings

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@app.command("serve")
def serve(
    storage: Annotated[
        str | None, typer.Option("--storage", help="SQLAlchemy URL (default: $TUNER_STORAGE or sqlite:///tuner.db)")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="interface to bind (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option("--port", min=1, max=65535, help="TCP port (default 8000)")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn log level")] = "info",
    default_study: Annotated[
        str | None,
        typer.Option("--default-study", help="the study GET /best-config serves without study= (default: required)"),
    ] = None,
) -> None:
    """Serve GET /best-config, /studies ... over HTTP (reads the storage; writes need TUNER_API_TOKEN)."""
    settings = load_settings(storage=storage, host=host, port=port, default_study=default_study)
    if not is_loopback(settings.host) and not settings.api_token:
        raise ConfigError(
            f"refusing to serve on {settings.host} (not loopback) without a token: set TUNER_API_TOKEN, "
            "or bind --host 127.0.0.1"
        )
    import uvicorn

    from api.app import create_app
    from tuner.storage import Store

    Store(settings.storage)  # fail fast, on one line, when the storage is unreachable or too new
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level)
