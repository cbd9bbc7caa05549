"""`tuner db upgrade`: creates or migrates the project's tables in place (they are also created/upgraded on first
use), through the alembic revisions in tuner/storage/migrations, and creates Optuna's."""

from __future__ import annotations

from typing import Annotated

import typer

from tuner.cli.app import SETUP, app, example
from tuner.declared import STORAGE_PANEL
from tuner.settings import load_settings
from tuner.storage import optuna_storage, upgrade
from tuner.storage.db import current_revision

db_app = typer.Typer(help="Storage schema commands.", no_args_is_help=True)
app.add_typer(db_app, name="db", rich_help_panel=SETUP)

StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help="SQLAlchemy URL (default: $TUNER_STORAGE or sqlite:///tuner.db)",
        rich_help_panel=STORAGE_PANEL,
    ),
]


@db_app.command("upgrade", epilog=example("tuner db upgrade --storage sqlite:///tuner.db"))
def db_upgrade(storage: StorageOpt = None) -> None:
    """Create or migrate the tuner tables (and Optuna's) in the storage, keeping their rows."""
    url = load_settings(storage=storage).storage
    before = current_revision(url)
    after = upgrade(url)
    optuna_storage(url, heartbeat_interval=None, grace_period=None)
    if before == after:
        typer.echo(f"tuner schema already at revision {after} (the latest this tuner knows)")
    else:
        typer.echo(f"tuner schema at revision {after} (was: {before or 'no tuner revision'})")
