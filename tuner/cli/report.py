"""`tuner report --study S -o report.html [--storage URL]`: the study as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

import typer

from tuner.cli.app import app
from tuner.settings import load_settings


@app.command("report")
def report(
    study: str = typer.Option(..., "--study", help="study name (see `tuner studies`)"),
    output: Path = typer.Option(Path("report.html"), "--output", "-o", help="HTML file to write"),
    storage: str = typer.Option(None, "--storage", help="SQLAlchemy URL; default $TUNER_STORAGE or sqlite:///tuner.db"),
) -> None:
    """Writes one self-contained HTML page: throughput and memory plots, the OOM frontier, the chosen config and its
    export, per-rank peaks with imbalance flags."""
    from tuner.reporting.html import write_report  # plotly/optuna load only for this command

    url = load_settings(storage=storage).storage
    path = write_report(url, study, output)
    typer.echo(f"report written to {path}")
