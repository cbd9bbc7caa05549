"""`tuner best`, `tuner trials`, `tuner studies`: read a storage, never probe."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tuner.cli.app import app
from tuner.cli.listing import (
    CSV_FIELDS,
    PHASE_HEADINGS,
    Listed,
    cells,
    listed_row,
    listed_trial,
    phase_cell,
    phases_shown,
    production_entries,
    select_rows,
    with_crash,
)
from tuner.cli.progress import fmt_num
from tuner.cli.safe_console import SafeConsole
from tuner.errors import ConfigError
from tuner.files import write_atomic
from tuner.job.definition import Job
from tuner.job.objective import Objective
from tuner.records import Fidelity, ProbeRow, ProbeStatus
from tuner.reporting.production import production_runs
from tuner.reporting.trials import join_trials
from tuner.session.best import best_of, pick_study
from tuner.settings import load_settings
from tuner.storage import Store
from tuner.units import format_size

if TYPE_CHECKING:
    from tuner.session.crash_line import StudyCrash

console = SafeConsole(highlight=False, soft_wrap=True)
if not console.is_terminal:  # logs and pipes: wide rows instead of 80 columns folded
    console = SafeConsole(highlight=False, soft_wrap=True, width=200)


def table_console() -> Console:
    """The console for `tuner trials`' table: the terminal's width, else $COLUMNS, else 100 columns."""
    found = SafeConsole(highlight=False)
    if found.is_terminal or "COLUMNS" in os.environ:
        return found
    return SafeConsole(highlight=False, width=100)


StorageOpt = Annotated[
    str | None, typer.Option("--storage", help="SQLAlchemy URL (default: $TUNER_STORAGE or sqlite:///tuner.db)")
]
StudyOpt = Annotated[str | None, typer.Option("--study", help="study name (default: the most recent study)")]
TransformersOpt = Annotated[
    str | None,
    typer.Option(
        "--transformers-version",
        help="your training host's transformers (the exports name fields and fill 'auto' as it does; default: "
        "the study's, else this host's)",
    ),
]


@app.command("best")
def best(
    storage: StorageOpt = None,
    study: StudyOpt = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="json | deepspeed | hf | accelerate | env")] = "json",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write to this file instead of stdout")] = None,
    changes: Annotated[
        bool, typer.Option("--changes", help="list what the export changes in your files (old -> new), not the file")
    ] = False,
    transformers_version: TransformersOpt = None,
) -> None:
    """Print (or write) the best stable config of a study; --changes lists what it changes in your own files."""
    from tuner.session.best import serve_best
    from tuner.session.options import cli_option

    store = Store(load_settings(storage=storage).storage, read_only=True)
    served = serve_best(store, study, fmt, option=cli_option, transformers_version=transformers_version)
    name = served.study
    text = "".join(line + "\n" for line in served.change_lines) if changes else served.content
    if served.caveat and not changes:  # --changes lists it first; stderr keeps `tuner best > ds.json` a config
        typer.echo(served.caveat, err=True)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        write_atomic(output, text)
    except OSError as err:
        raise ConfigError(f"cannot write {output}: {err.strerror}; pick a writable path for -o") from None
    console.print(Text(f"wrote the best config of study {name!r} ({fmt}) to {output}", style="dim"))


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


@app.command("trials")
def trials(
    storage: StorageOpt = None,
    study: StudyOpt = None,
    everything: Annotated[
        bool, typer.Option("--all", help="every trial in trial order (ruled out, reused and failed ones too)")
    ] = False,
    status: Annotated[str | None, typer.Option("--status", help="only this status: ok, oom, inferred-oom ...")] = None,
    top: Annotated[int | None, typer.Option("--top", min=1, help="only the first N")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON lines, one trial each, every field; then the production runs")
    ] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV with a header row; the production runs last")] = False,
) -> None:
    """List a study's probes, best first (--all: every trial): status and cause, throughput, peak memory, config; then
    the production runs your training recorded (TunerCallback)."""
    statuses = [str(s.value) for s in ProbeStatus]
    if status is not None and status not in statuses:
        raise ConfigError(f"--status {status!r} is not a probe status; give one of: {', '.join(statuses)}")
    store = Store(load_settings(storage=storage).storage, read_only=True)
    name, definition = pick_study(store, study)
    objective = Objective.from_dict(definition.objective)
    from tuner.session.crash_line import study_crash

    probes = store.probes(name)
    crash = study_crash(definition, probes)
    listed = with_crash(select_rows(trial_rows(store, name), everything=everything, status=status, top=top), crash)
    runs = production_runs(probes)
    if as_json or as_csv:
        _print_data([*listed, *production_entries(runs, status)], as_csv)
        return
    job = definition.job
    out = table_console()
    held = f"; held fixed, not shown: {Job.model_validate(job).describe()}" if job else ""
    out.print(Text(f"study {name} ({objective.unit}){held}"))
    table = Table(box=None, pad_edge=False)
    for col in ("trial", "status", objective.unit, "peak", "s"):  # the Optuna state: --json
        table.add_column(col, no_wrap=True)
    phases = phases_shown(listed)
    if phases:  # rows stored with per-phase peaks (issue 22): the train and eval peaks beside the peak
        table.add_column(" / ".join(PHASE_HEADINGS[p] for p in phases), no_wrap=True)
    table.add_column("config", overflow="fold", min_width=30)
    rendered = [_with_phases(cells(r, job), r, phases) for r in listed]
    causes = any(c[-1] for c in rendered)
    if causes:  # a column only when some row has a cause or per-rank peaks to show
        table.add_column("cause / ranks", overflow="fold")
    for c in rendered:
        table.add_row(*(Text(x) for x in (c if causes else c[:-1])))  # stored text ("[stderr: ...]"): not markup
    out.print(table)
    if not listed:
        out.print(Text(f"study {name!r} has no trials to list yet" + ("" if everything else " (try --all)")))
    for run in runs:
        out.print(Text(run.line()))
    _print_crash(out, crash, listed)


def _print_crash(out: Console, crash: StudyCrash | None, listed: list[Listed]) -> None:
    """With the study's data: where it came from, then each listed config's crash line (tuner.session.crash_line),
    a line each, never folded (a terminal wraps it; a pipe keeps it whole)."""
    if crash is not None:
        out.print(Text(f"your data: {crash.summary.origin.describe(crash.summary.samples)}"), soft_wrap=True)
    for r in listed:
        if r.crash:
            out.print(Text(r.crash), soft_wrap=True)


def _with_phases(row: tuple[str, ...], listed: Listed, phases: list[str]) -> tuple[str, ...]:
    """The table row with the phase-peak cell after the seconds (when the table has that column)."""
    return (*row[:5], phase_cell(listed, phases), *row[5:]) if phases else row


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


@app.command("studies")
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
        job = Job.model_validate(d.job).describe() if d.job else "-"
        table.add_row(
            Text(s.name),  # stored text, never rich markup
            str(s.created_at)[:19],
            Text(d.model_source or "-"),
            Text(job),
            str(d.world_size or "-"),
            str(d.global_batch or "-"),
            str(sum(1 for p in probes if p.measured)),
            fmt_num(found.objective) if found else "-",
            Objective.from_dict(d.objective).unit,
        )
    console.print(table)
    if not rows:
        console.print("no studies yet; run `tuner search --budget 30m`")
