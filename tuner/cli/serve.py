"""`tuner serve`: the HTTP API (api/) under uvicorn. Loopback by default; another interface needs a token."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from tuner.cli.app import SETUP, app, err_console, example
from tuner.declared import STORAGE_PANEL
from tuner.errors import ConfigError
from tuner.hosts import is_loopback, serve_default
from tuner.settings import load_settings

SERVER_PANEL = "Server"


@app.command("serve", rich_help_panel=SETUP, epilog=example("tuner serve --port 8000"))
def serve(
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            help="SQLAlchemy URL (default: $TUNER_STORAGE or sqlite:///tuner.db)",
            rich_help_panel=STORAGE_PANEL,
        ),
    ] = None,
    host: Annotated[
        str | None, typer.Option("--host", help="interface to bind (default 127.0.0.1)", rich_help_panel=SERVER_PANEL)
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", min=1, max=65535, help="TCP port (default 8000)", rich_help_panel=SERVER_PANEL),
    ] = None,
    log_level: Annotated[
        str, typer.Option("--log-level", help="uvicorn log level", rich_help_panel=SERVER_PANEL)
    ] = "info",
    default_study: Annotated[
        str | None,
        typer.Option(
            "--default-study",
            help="the study GET /best-config serves without study= (default: required)",
            rich_help_panel=STORAGE_PANEL,
        ),
    ] = None,
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            "--allowed-hosts",
            help="comma-separated Host names answered (tuner.internal,*.corp.example,10.0.0.5; * any); default: the "
            "loopback names on a loopback bind, any Host elsewhere ($TUNER_ALLOWED_HOSTS)",
            rich_help_panel=SERVER_PANEL,
        ),
    ] = None,
) -> None:
    """Serve the dashboard at / (studies, each study's pick, exports, plots and trials) and the JSON API (GET
    /best-config, /studies ...) over HTTP; reads the storage, writes need TUNER_API_TOKEN."""
    settings = load_settings(
        storage=storage, host=host, port=port, default_study=default_study, allowed_hosts=allowed_hosts
    )
    if not is_loopback(settings.host) and not settings.api_token:
        raise ConfigError(
            f"refusing to serve on {settings.host} (not loopback) without a token: set TUNER_API_TOKEN, "
            "or bind --host 127.0.0.1"
        )
    if settings.allowed_hosts is None:
        default = serve_default(settings.host)
        if default is None:
            err_console.print(
                escape(
                    f"note: answering any Host header on {settings.host}; --allowed-hosts (or TUNER_ALLOWED_HOSTS) "
                    "names the ones clients use and refuses the rest (DNS-rebinding pages)"
                )
            )
        settings = settings.model_copy(update={"allowed_hosts": default})
    import uvicorn

    from api.app import create_app
    from tuner.storage import Store

    Store(settings.storage)  # fail fast, on one line, when the storage is unreachable or too new
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level)
