"""What a study's page shows, read once: its definition and probe rows, the pick with its figure, its exports and
changes, the user's production runs and crash lines (``load``: from a storage URL, for `tuner report`; ``load_rows``:
from rows already read, for the dashboard). Rendered by tuner.reporting.html (the file) and api.dashboard (`/`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner.errors import ConfigError, StudyNotFound
from tuner.job.objective import Objective
from tuner.records import Candidate, ProbeRow, StudyDefinition, baseline_row
from tuner.records.throughput import Throughput, throughput
from tuner.session.best import best_of
from tuner.storage.store import Store

MiB = float(1 << 20)


@dataclass
class ReportData:
    study: str
    definition: StudyDefinition
    rows: list[ProbeRow]
    optuna_study: Any | None  # optuna.Study when Optuna has the study
    best: Candidate | None
    exports: dict[str, str] = field(default_factory=dict)  # format -> text (tuner.interop.export.render)
    changes: list[str] = field(default_factory=list)  # what the export changes in the user's files (`best --changes`)
    production: list[str] = field(default_factory=list)  # the user's real runs beside the probes (production rows)
    crash: list[str] = field(default_factory=list)  # with the study's data: when the baseline / the pick would crash
    verdict: str | None = None  # the pick against the user's config (the speed-up: tuner.records.throughput)

    @property
    def job(self) -> dict[str, Any] | None:
        """The job held fixed (its values are left out of each probe's label)."""
        return self.definition.job

    @property
    def unit(self) -> str:
        """The study's objective unit (samples/s, or retained tokens/s when the search varied max_length)."""
        return Objective.from_dict(self.definition.objective).unit

    @property
    def pick(self) -> tuple[Candidate, Throughput] | None:
        """The pick with its figure (the median of its probes), as every face shows it."""
        figure = throughput(self.best.rows) if self.best is not None else None
        return (self.best, figure) if self.best is not None and figure is not None else None

    @property
    def headroom(self) -> float:
        return self.definition.headroom

    @property
    def capacity(self) -> int | None:
        caps = [int(r.capacity) for r in self.rows if r.capacity]
        if caps:
            return max(caps)
        return self.definition.device_memory


def _load_optuna_study(url: str, name: str) -> Any | None:
    import optuna

    from tuner.storage.db import optuna_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna_storage(url, heartbeat_interval=None, grace_period=None)
    if name not in {s.study_name for s in storage.get_all_studies()}:
        return None
    return optuna.load_study(study_name=name, storage=storage)


def _exports(best: Candidate, definition: StudyDefinition) -> dict[str, str]:
    """The chosen config in each export format (tuner.interop.export), exactly as `GET /best-config` hands it out."""
    from tuner.interop.export import render_best

    out: dict[str, str] = {}
    order = ("deepspeed", "hf", "accelerate", "env", "json")
    if best.knobs.get("engine") == "fsdp2":  # no DeepSpeed JSON (its tab says so): the accelerate config first
        order = ("accelerate", "hf", "env", "json", "deepspeed")
    for fmt in order:
        try:
            out[fmt] = render_best(fmt, best, definition)
        except (TypeError, ValueError, KeyError, ConfigError) as err:  # a stored config the export cannot map
            out[fmt] = f"(cannot render {fmt}: {err})"
    return out


def load(url: str, study: str) -> ReportData:
    """Reads everything the report shows; StudyNotFound when neither our tables nor Optuna know ``study``."""
    store = Store(url, read_only=True)
    stored = store.definition(study)
    optuna_study = _load_optuna_study(url, study)
    if stored is None and optuna_study is None:
        raise StudyNotFound(f"no study named {study!r} in this storage; `tuner studies` lists the known ones")
    return load_rows(study, stored, store.probes(study), optuna_study)


def load_rows(study: str, stored: StudyDefinition | None, rows: list[ProbeRow], optuna_study: Any = None) -> ReportData:
    """The report's data from a study's definition and probe rows already read (the dashboard reads them through the
    API's pooled store); ``optuna_study``: Optuna's views, when the caller loaded the study."""
    best = best_of(rows)
    from tuner.session.crash_line import pick_lines, study_crash

    found = study_crash(stored, rows) if stored is not None else None
    crash = pick_lines(found, best.knobs if best is not None else None, baseline_row(rows))
    definition = stored or StudyDefinition()
    exports = _exports(best, definition) if best is not None else {}
    changes: list[str] = []
    verdict = None
    if best is not None:
        from tuner.interop.export.changes import best_changes

        found_changes = best_changes(best, definition, baseline_row(rows), rows=rows)
        changes, verdict = found_changes.lines(), found_changes.verdict
    from tuner.reporting.production import production_runs

    production = [run.line() for run in production_runs(rows)]
    return ReportData(study, definition, rows, optuna_study, best, exports, changes, production, crash, verdict)


__all__ = ["ReportData", "load", "load_rows"]
