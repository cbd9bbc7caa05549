"""`tuner trials`, `tuner studies`: read a storage, never probe (`tuner best` and `tuner export`: tuner.cli.export)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from tuner.cli.app import RESULTS, app, example
from tuner.cli.export import StorageOpt, StudyOpt
from tuner.cli.listing import (
    CSV_FIELDS,
    Listed,
    listed_row,
    listed_trial,
    mark_pick,
    production_entries,
    select_rows,
    with_crash,
)
from tuner.cli.progress import fmt_num
from tuner.cli.safe_console import SafeConsole
from tuner.cli.trials_print import Listing, print_listing
from tuner.declared import OUTPUT_PANEL
from tuner.errors import ConfigError
from tuner.job.definition import Job
from tuner.job.objective import Objective
from tuner.records import Fidelity, ProbeRow, ProbeStatus
from tuner.records.throughput import throughput
from tuner.reporting.production import production_runs
from tuner.reporting.trials import join_trials
from tuner.session.best import best_of, pick_study
from tuner.settings import load_settings
from tuner.storage import Store
from tuner.units import format_size

console = SafeConsole(highlight=False, soft_wrap=True)
if not console.is_terminal:  # logs and pipes: wide rows instead of 80 columns folded
    console = SafeConsole(highlight=False, soft_wrap=True, width=200)


def trial_rows(store: Store, name: str) -> list[Listed]:
    """One entry per Optuna trial (tuner.reporting.trials.join_trials: state from Optuna, measurements from its latest
    probe row) plus each confirm probe that belongs to no trial."""
    import optuna

    from tuner.storage import optuna_storage

    rows = store.probes(name)
    try:
        trials = optuna.load_study(study_name=name, storage=optuna_storage(store.url, None, None)).trials
    except KeyError:  # a study defined (e.g. via the API) that no worker has started yet
        trials = []
    records = join_trials(trials, rows)
    out = [listed_trial(rec, rank_note(rec.latest)) for rec in records]
    joined = {rec.number for rec in records}
    out += [
        listed_row(r, rank_note(r)) for r in rows if r.fidelity == Fidelity.CONFIRM and r.trial_number not in joined
    ]
    return out


def rank_note(row: ProbeRow | None) -> str:
    """Per-rank peaks of a multi-rank probe (its typed measurement), with the imbalance flag (> 20% spread) and its
    likely causes."""
    from tuner.memory.imbalance import rank_imbalance

    imb = rank_imbalance(row.measurement.ranks) if row is not None else None
    if imb is None:
        return ""
    peaks = " ".join(f"r{rank}={format_size(peak)}" for rank, peak in imb.peaks.items())
    return f"{peaks}: {imb.summary()}"


@app.command("trials", rich_help_panel=RESULTS, epilog=example("tuner trials --study flan-large --all"))
def trials(
    storage: StorageOpt = None,
    study: StudyOpt = None,
    everything: Annotated[
        bool,
        typer.Option(
            "--all",
            help="every trial in trial order (ruled out, reused and failed ones too)",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = False,
    status: Annotated[
        str | None,
        typer.Option("--status", help="only this status: ok, oom, inferred-oom ...", rich_help_panel=OUTPUT_PANEL),
    ] = None,
    top: Annotated[
        int | None, typer.Option("--top", min=1, help="only the first N", rich_help_panel=OUTPUT_PANEL)
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="JSON lines, one trial each, every field; then the production runs",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = False,
    as_csv: Annotated[
        bool,
        typer.Option("--csv", help="CSV with a header row; the production runs last", rich_help_panel=OUTPUT_PANEL),
    ] = False,
    wide: Annotated[
        bool,
        typer.Option(
            "--wide",
            help="every column at full width, one line per row (default: fit the terminal)",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = False,
) -> None:
    """List a study's trials, best first: status, throughput, peak memory, config.

    Probes best first (--all: every trial, ruled-out ones too) with their cause; then the production runs your
    training recorded (TunerCallback). On a terminal the table fits its width; piped, one tab-separated line per
    row."""
    statuses = [str(s.value) for s in ProbeStatus]
    if status is not None and status not in statuses:
        raise ConfigError(f"--status {status!r} is not a probe status; give one of: {', '.join(statuses)}")
    store = Store(load_settings(storage=storage).storage, read_only=True)
    name, definition = pick_study(store, study)
    from tuner.session.crash_line import study_crash

    probes = store.probes(name)
    crash = study_crash(definition, probes)
    listed = with_crash(select_rows(trial_rows(store, name), everything=everything, status=status, top=top), crash)
    best = best_of(probes)
    if best is not None:
        listed = mark_pick(listed, best.trial_number, throughput(best.rows))
    runs = production_runs(probes)
    if as_json or as_csv:
        _print_data([*listed, *production_entries(runs, status)], as_csv)
        return
    production = [(listed_row(run.row, "", run), run) for run in runs]
    listing = Listing(
        name,
        definition,
        listed,
        [(entry, run) for entry, run in production if status is None or entry.status_text == status],
        data_origin=crash.summary.origin.describe(crash.summary.samples) if crash is not None else None,
        empty_note=f"study {name!r} has no trials to list yet" + ("" if everything else " (try --all)"),
    )
    print_listing(listing, wide)


def _print_data(rows: list[Listed], as_csv: bool) -> None:
    import csv
    import json
    import sys

    if not as_csv:
        for r in rows:
            typer.echo(json.dumps(r.to_json(), default=str))
        return
    writer = csv.DictWriter(sys.stdout, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow(r.to_csv())


@app.command("studies", rich_help_panel=RESULTS, epilog=example("tuner studies"))
def studies(storage: StorageOpt = None) -> None:
    """List the studies in a storage, newest first, with their best stable throughput."""
    store = Store(load_settings(storage=storage).storage, read_only=True)
    table = Table(title="studies")
    for col in ("study", "created", "model", "job (held fixed)", "world", "global batch", "probes", "best", "unit"):
        table.add_column(col)
    rows = store.studies()
    for s in rows:
        d = s.definition
        probes = store.probes(s.name)
        found = best_of(probes)
        figure = throughput(found.rows) if found is not None else None
        job = Job.model_validate(d.job).describe() if d.job else "-"
        table.add_row(
            Text(s.name),  # stored text, never rich markup
            str(s.created_at)[:19],
            Text(d.model_source or "-"),
            Text(job),
            str(d.world_size or "-"),
            str(d.global_batch or "-"),
            str(sum(1 for p in probes if p.measured)),
            fmt_num(figure.value) if figure else "-",
            Objective.from_dict(d.objective).unit,
        )
    console.print(table)
    if not rows:
        console.print("no studies yet; run `tuner search --budget 30m`")
