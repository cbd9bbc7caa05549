"""What `tuner trials` lists, typed: one ``Listed`` per Optuna trial (tuner.reporting.trials.join_trials), per confirm
probe of no trial, and per production run the user's training recorded (tuner.reporting.production); which of them
a listing shows, in which order; their table cells and their JSON / CSV records. Pure: tuner.cli.results reads the
storage and prints."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.cli.progress import brief_cause, compact, fmt_num
from tuner.memory.frontier import describe
from tuner.records import Fidelity, ProbeRow, ProbeStatus
from tuner.records.throughput import Throughput
from tuner.reporting.production import ProductionRun
from tuner.reporting.trials import TrialRecord
from tuner.units import format_size

if TYPE_CHECKING:
    from tuner.session.crash_line import StudyCrash

#: the CSV's columns (--csv); the JSON lines carry every field of ``Listed.to_json``
CSV_FIELDS = ("trial", "state", "fidelity", "status", "objective", "peak", "stable", "seconds", "config", "cause")


@dataclass(frozen=True)
class Listed:
    trial: int | None
    state: str  # Optuna's (COMPLETE, PRUNED, FAIL, RUNNING ...); CONFIRM / PRODUCTION for rows of no trial
    fidelity: str
    status: ProbeStatus | None  # None: nothing known yet (a running trial)
    cause: str
    objective: float | None
    peak: int | None
    stable: bool | None
    knobs: dict[str, Any]
    reused_from: int | None
    seconds: float | None
    ranks: str  # per-rank peaks of a multi-rank probe, with the imbalance flag ("" when not one)
    production: ProductionRun | None = None  # a production run: what it recorded beside the probes
    phase_peaks: dict[str, int] = field(default_factory=dict)  # peak per phase, most over ranks (Measurement)
    crash: str | None = None  # with the study's data: when this config would crash on it (tuner.session.crash_line)
    pick: Throughput | None = None  # the study's pick (its trial's row): ``objective`` is then the pick's figure

    @property
    def status_text(self) -> str:
        return self.status.value if self.status is not None else ""

    def to_json(self) -> dict[str, Any]:
        """The JSON line of --json: every field (a production run also its device, rank, steps, phase and what the
        probes of its config measured)."""
        out: dict[str, Any] = {
            "trial": self.trial,
            "state": self.state,
            "fidelity": self.fidelity,
            "status": self.status_text,
            "cause": self.cause,
            "objective": self.objective,
            "peak": self.peak,
            "stable": self.stable,
            "knobs": self.knobs,
            "reused_from": self.reused_from,
            "seconds": self.seconds,
            "ranks": self.ranks,
            "phase_peaks": self.phase_peaks,
            "crash": self.crash,
            "pick": self.pick is not None,
        }
        if self.production is not None:
            rec = self.production.recorded
            out["production"] = {
                **rec.to_json(),
                "peak_reserved": self.production.row.peak_reserved,
                "capacity": self.production.row.capacity,
                "samples_per_s": self.production.row.samples_per_s,
                "probed_peak": self.production.probed_peak,
                "probed_samples_per_s": self.production.probed_samples_per_s,
            }
        return out

    def to_csv(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in CSV_FIELDS if name not in ("status", "config")},
            "status": self.status_text,
            "config": describe(self.knobs) if self.knobs else "",
        }


def _phases(row: ProbeRow | None) -> dict[str, int]:
    return row.measurement.phase_peaks if row is not None else {}


def listed_trial(rec: TrialRecord, ranks: str) -> Listed:
    return Listed(
        trial=rec.number,
        state=rec.state,
        fidelity=rec.fidelity,
        status=rec.status,
        cause=rec.cause or "",
        objective=rec.objective,
        peak=rec.peak_allocated,
        stable=rec.stable,
        knobs=rec.knobs,
        reused_from=rec.reused_from,
        seconds=rec.probe_seconds,
        ranks=ranks,
        phase_peaks=_phases(rec.latest),
    )


def listed_row(row: ProbeRow, ranks: str, production: ProductionRun | None = None) -> Listed:
    """A probe row of no trial: a confirm probe, or a production run (``production``)."""
    return Listed(
        trial=row.trial_number,
        state="PRODUCTION" if production is not None else "CONFIRM",
        fidelity=row.fidelity.value,
        status=row.status,
        cause=row.cause or "",
        objective=row.objective,
        peak=row.peak_allocated,
        stable=row.stable,
        knobs=row.knobs,
        reused_from=None,
        seconds=row.probe_seconds,
        ranks=ranks,
        production=production,
        phase_peaks=_phases(row),
    )


def with_crash(rows: Sequence[Listed], crash: StudyCrash | None) -> list[Listed]:
    """Each row with its crash line on the study's data (tuner.session.crash_line): the baseline's always, any other
    config's when it fits typical batches but not the worst (one line per config, on its first row)."""
    if crash is None:
        return list(rows)
    out, seen = [], set()
    for r in rows:
        key = describe(r.knobs) if r.knobs else None
        if key is None or key in seen or r.production is not None:
            out.append(r)
            continue
        seen.add(key)
        baseline = r.fidelity == Fidelity.BASELINE
        whose = ("-" if r.trial is None else f"trial {r.trial}") + (" (your config)" if baseline else "")
        out.append(dataclasses.replace(r, crash=crash.shown(r.knobs, whose, always=baseline)))
    return out


def select_rows(
    rows: Iterable[Listed], *, everything: bool = False, status: str | None = None, top: int | None = None
) -> list[Listed]:
    """What `tuner trials` lists: by default the probes that ran (not configs ruled out without running, nor trials
    that reused an earlier measurement), best first: stable by objective, then unstable, then failures by trial.
    ``everything``: every trial in trial order. ``status`` filters, ``top`` keeps the first N. Production runs are
    not trials: the caller lists them after (``production_entries``)."""
    if everything:
        picked = list(rows)
    else:
        picked = [
            r
            for r in rows
            if r.reused_from is None and r.fidelity != Fidelity.INFERRED and r.status != ProbeStatus.INFERRED_OOM
        ]
        picked.sort(
            key=lambda r: (
                0 if r.stable else (r.status.listing_order if r.status is not None else 6),
                -(r.objective or 0.0),
                -1 if r.trial is None else r.trial,
            )
        )
    if status is not None:
        picked = [r for r in picked if r.status_text == status]
    return picked[:top] if top is not None else picked


def production_entries(runs: Sequence[ProductionRun], status: str | None = None) -> list[Listed]:
    """The production runs, oldest first, as --json / --csv list them after the trials (the table as its last rows,
    each with its whole line as the cause); ``status`` filters them as it filters the trials."""
    listed = [listed_row(run.row, "", run) for run in runs]
    return [r for r in listed if status is None or r.status_text == status]


def mark_pick(rows: Sequence[Listed], trial: int | None, figure: Throughput | None) -> list[Listed]:
    """The rows with the pick's trial marked and showing the pick's figure (tuner.records.throughput: the median of
    its probes), the number every face shows for it; the other rows show their own probe's measurement."""
    if trial is None or figure is None:
        return list(rows)
    return [
        dataclasses.replace(r, objective=figure.value, pick=figure)
        if r.trial == trial and r.state not in ("CONFIRM", "PRODUCTION")
        else r
        for r in rows
    ]


def cause_text(r: Listed) -> str:
    """The cause cell: an OOM's failed allocation (its whole message: --json); a refusal whole (it is the only answer
    to why the config never ran, and it names the fix); any other cause's first 160 characters (an error's stderr
    can run to pages: --json has it whole). Always one line."""
    if r.status == ProbeStatus.OOM and r.cause:
        return brief_cause(ProbeStatus.OOM, r.cause)
    text = " ".join(r.cause.split())
    if r.status == ProbeStatus.REFUSED or len(text) <= 160:
        return text
    return text[:159] + "\u2026"


#: the phase-peak column's heading per phase (trials.contract.MEMORY_PHASES)
PHASE_HEADINGS = {"train": "train", "eval_forward": "eval", "generate": "generate"}


def phases_shown(rows: Iterable[Listed]) -> list[str]:
    """The phases some listed row has a stored peak of, in MEMORY_PHASES order ([]: no row has any, no column)."""
    seen = {p for r in rows for p in r.phase_peaks}
    return [p for p in PHASE_HEADINGS if p in seen]


def phase_cell(r: Listed, phases: Sequence[str]) -> str:
    """The peaks of ``phases`` of a row, "/"-separated; "-" for a phase it has no peak of (not stored, or not run)."""
    return " / ".join(format_size(r.phase_peaks[p]) if p in r.phase_peaks else "-" for p in phases)


@dataclass(frozen=True)
class Cells:
    """A listed row as text, one field per column of `tuner trials` (tuner.cli.trials_table lays them out)."""

    trial: str
    status: str
    value: str
    peak: str
    seconds: str
    phases: str
    config: str
    cause: str  # the cause and a multi-rank probe's per-rank peaks, "; "-joined ("" when neither)
    crash: str = ""  # with the study's data: when this config would crash on it (a pipe's column; the table's notes)


def cells(r: Listed, job: Mapping[str, Any] | None = None, phases: Sequence[str] = ()) -> Cells:
    """A table row: trial (and fidelity when not a short probe), status ("pick" on the pick's), objective, peak,
    seconds, per-phase peaks, config, cause."""
    trial = "-" if r.trial is None else str(r.trial)
    status = r.status_text + ("" if r.status != ProbeStatus.OK or r.stable else " unstable")
    return Cells(
        trial=trial if r.fidelity in (Fidelity.SHORT, "") else f"{trial} {r.fidelity}",
        status=status + (" pick" if r.pick is not None else ""),
        value=fmt_num(r.objective),
        peak=format_size(r.peak),
        seconds=f"{r.seconds:.0f}" if r.seconds else "-",
        phases=phase_cell(r, phases) if phases else "",
        config=compact(r.knobs, job) if r.knobs else "-",
        cause="; ".join(x for x in (cause_text(r), " ".join(r.ranks.split())) if x),
        crash=r.crash or "",
    )


__all__ = [
    "CSV_FIELDS",
    "Cells",
    "Listed",
    "cause_text",
    "cells",
    "listed_row",
    "listed_trial",
    "mark_pick",
    "phase_cell",
    "phases_shown",
    "production_entries",
    "select_rows",
    "with_crash",
]
