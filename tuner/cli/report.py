"""`tuner report --study S -o report.html [--storage URL]`: the study as one self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

import typer

from tuner.cli.app import RESULTS, app, example
from tuner.declared import OUTPUT_PANEL, STORAGE_PANEL
from tuner.settings import load_settings


@app.command("report", rich_help_panel=RESULTS, epilog=example("tuner report --study flan-large -o report.html"))
def report(
    study: str = typer.Option(..., "--study", help="study name (see `tuner studies`)", rich_help_panel=STORAGE_PANEL),
    output: Path = typer.Option(
        Path("report.html"), "--output", "-o", help="HTML file to write", rich_help_panel=OUTPUT_PANEL
    ),
    storage: str = typer.Option(
        None,
        "--storage",
        help="SQLAlchemy URL; default $TUNER_STORAGE or sqlite:///tuner.db",
        rich_help_panel=STORAGE_PANEL,
    ),
) -> None:
    """Write one self-contained HTML page of a study (works offline).

    The chosen config and its exports, the wall (throughput against memory per rank, OOMs at what they needed, the
    capacity and headroom lines), per-phase and per-rank peaks, the trial table. `tuner serve` shows the same at /."""
    from tuner.reporting.html import write_report  # plotly/optuna load only for this command

    url = load_settings(storage=storage).storage
    path = write_report(url, study, output)
    typer.echo(f"report written to {path}")
