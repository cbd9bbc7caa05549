"""`tuner db upgrade`: creates or migrates the project's tables (they are also created on first use)."""

from __future__ import annotations

from typing import Annotated

import typer

from tuner.cli.app import app
from tuner.settings import load_settings
from tuner.storage import optuna_storage, upgrade

db_app = typer.Typer(help="Storage schema commands.", no_args_is_help=True)
app.add_typer(db_app, name="db")

StorageOpt = Annotated[
    str | None, typer.Option("--storage", help="SQLAlchemy URL (default: $TUNER_STORAGE or sqlite:///tuner.db)")
]


@db_app.command("upgrade")
def db_upgrade(storage: StorageOpt = None) -> None:
    """Create or migrate the tuner tables (and Optuna's) in the storage."""
    url = load_settings(storage=storage).storage
    version = upgrade(url)
    optuna_storage(url, heartbeat_interval=None, grace_period=None)
    typer.echo(f"storage schema at v{version}")
