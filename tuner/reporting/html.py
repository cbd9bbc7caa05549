"""`tuner report`: one self-contained HTML page of a study — plots (plotly, inlined once), the chosen config and its
export, per-rank peaks with imbalance flags. Every stored string is HTML-escaped before it reaches the page."""

from __future__ import annotations

import datetime as dt
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from tuner.errors import ConfigError, StudyNotFound
from tuner.files import write_atomic
from tuner.interop.export.changes import engine_name
from tuner.memory.imbalance import rank_imbalance
from tuner.records import Candidate, Fidelity, ProbeRow, StudyDefinition, baseline_row
from tuner.reporting import figures as figs
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
    rows = store.probes(study)
    best = best_of(rows)
    from tuner.session.crash_line import pick_lines, study_crash

    found = study_crash(stored, rows) if stored is not None else None
    crash = pick_lines(found, best.knobs if best is not None else None, baseline_row(rows))
    definition = stored or StudyDefinition()
    exports = _exports(best, definition) if best is not None else {}
    changes: list[str] = []
    if best is not None:
        from tuner.interop.export.changes import best_changes

        changes = best_changes(best, definition, baseline_row(rows)).lines()
    from tuner.reporting.production import production_runs

    production = [run.line() for run in production_runs(rows)]
    return ReportData(study, definition, rows, optuna_study, best, exports, changes, production, crash)


# -- HTML ----------------------------------------------------------------------------------------------------------
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{margin-bottom:4px} .sub{color:#666;margin-top:0} table{border-collapse:collapse;margin:8px 0 16px}
td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;font-size:14px} th{background:#f4f4f4}
pre{background:#f7f7f7;padding:10px;overflow-x:auto;font-size:13px} .flag{color:#b00020;font-weight:600}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:12px} .card{border:1px solid #eee;border-radius:6px;padding:6px}
.empty{color:#888;font-style:italic} details{margin:6px 0}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class _Figures:
    """Turns figures into divs; the first one carries plotly.js inline so the page needs no network."""

    def __init__(self) -> None:
        self.count = 0

    def div(self, fig: go.Figure | None, empty: str = "nothing to plot yet") -> str:
        if fig is None or not fig.data:
            return f'<div class="card empty">{_e(empty)}</div>'
        first = self.count == 0
        self.count += 1
        inner = fig.to_html(
            full_html=False,
            include_plotlyjs=bool(first),
            div_id=f"plot-{self.count}",
            config={"displaylogo": False, "responsive": True},
        )
        return f'<div class="card plot">{inner}</div>'


def _optuna_figures(study: Any) -> list[go.Figure]:
    """Optuna's own views, when the study has finished trials to show."""
    import optuna
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    out: list[go.Figure] = []
    if trials:
        out.append(optuna.visualization.plot_timeline(study))
    if any(t.state == TrialState.COMPLETE for t in trials):
        out.append(optuna.visualization.plot_optimization_history(study, target_name="objective"))
    return out


def _summary(data: ReportData) -> str:
    """Probes counted as probes: the ones that ran (by status), apart from the configs ruled out without running
    and the user's production runs."""
    ran = [row for row in data.rows if row.measured]
    counts: dict[str, int] = {}
    for row in ran:
        counts[str(row.status)] = counts.get(str(row.status), 0) + 1
    items: list[list[Any]] = [["probes run", len(ran)], *[[f"probes {k}", v] for k, v in sorted(counts.items())]]
    inferred = sum(1 for row in data.rows if row.fidelity == Fidelity.INFERRED)
    if inferred:
        items.append(["ruled out without running (inferred-oom)", inferred])
    production = sum(1 for row in data.rows if row.fidelity == Fidelity.PRODUCTION)
    if production:
        items.append(["your training runs recorded", production])
    if data.optuna_study is not None:
        items.append(["optuna trials", len(data.optuna_study.get_trials(deepcopy=False))])
    if data.capacity:
        items.append(["capacity per rank", f"{data.capacity / MiB:,.0f} MiB"])
    items.append(["headroom", f"{data.headroom:.0%}"])
    return _table(["", ""], items)


def _best_section(data: ReportData) -> str:
    best = data.best
    if best is None:
        return (
            '<p class="empty">No stable config yet: no probe finished under the headroom without allocator retries.</p>'
        )
    peak = f"{best.peak_allocated / MiB:,.1f} MiB"
    if best.capacity:
        peak += f" ({best.peak_allocated / best.capacity:.0%} of capacity)"
    facts: list[list[Any]] = [
        ["engine", engine_name(best.knobs)],
        ["objective", f"{best.objective:,.2f}"],
        ["samples/s", f"{best.samples_per_s:,.2f}"],
        ["peak allocated", peak],
        ["confirmed (re-probed longer)", "yes" if best.confirmed else "no"],
        ["measurements", best.measurements],
        ["trial", best.trial_number],
    ]
    knobs: list[list[Any]] = [[k, v] for k, v in sorted(best.knobs.items()) if v is not None]
    exports = "".join(
        f"<details{' open' if i == 0 else ''}><summary>{_e(fmt)}</summary><pre>{_e(text)}</pre></details>"
        for i, (fmt, text) in enumerate(data.exports.items())
    )
    changes = "<h3>Changes to your files</h3><pre>" + _e("\n".join(data.changes)) + "</pre>" if data.changes else ""
    if data.production:
        changes += "<h3>Your training runs</h3><pre>" + _e("\n".join(data.production)) + "</pre>"
    return _table(["", ""], facts) + _table(["knob", "value"], knobs) + changes + "<h3>Export</h3>" + exports


def _ranks_section(data: ReportData, figures: _Figures) -> str:
    lines: list[list[Any]] = []
    for row in data.rows:
        imb = rank_imbalance(row.measurement.ranks)
        if imb is None:
            continue
        peaks = ", ".join(f"r{r}: {p / MiB:,.1f}" for r, p in imb.peaks.items())
        lines.append([row.id, row.trial_number, row.status, peaks, imb.summary()])
    if not lines:
        return '<p class="empty">No multi-rank probes in this study.</p>'
    table = _table(["probe", "trial", "status", "peak MiB per rank", "imbalance"], lines)
    table = table.replace("<td>IMBALANCE", '<td class="flag">IMBALANCE')
    causes = sorted(
        {c for row in data.rows if (i := rank_imbalance(row.measurement.ranks)) and i.flagged for c in i.causes}
    )
    hint = "".join(f"<li>{_e(c)}</li>" for c in causes)
    hint = f"<p>Likely causes of the flagged spreads:</p><ul>{hint}</ul>" if hint else ""
    return figures.div(figs.rank_peaks(data.rows)) + table + hint


def render_html(data: ReportData) -> str:
    figures = _Figures()
    rows = data.rows
    plots = [
        figures.div(figs.throughput_over_time(rows), "no measured probes yet"),
        figures.div(figs.throughput_vs_micro_batch(rows), "no measured probes yet"),
        figures.div(figs.memory_vs_micro_batch(rows, data.capacity, data.headroom), "no peak memory recorded yet"),
    ]
    phases = figs.phase_peaks(rows)
    if phases is not None:  # rows stored with per-phase peaks (train, eval forward, generate)
        plots.append(figures.div(phases))
    if len({r.knobs.get("max_length") for r in rows if r.knobs}) > 1:  # a frontier over lengths needs two of them
        plots.append(figures.div(figs.oom_frontier(rows), "no configs tried yet"))
    optuna_plots = [figures.div(f) for f in _optuna_figures(data.optuna_study)] if data.optuna_study else []
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    definition = json.dumps(data.definition.to_json(), indent=2, sort_keys=True, default=str)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>tuner report: {_e(data.study)}</title><style>{CSS}</style></head><body>",
        f"<h1>Study {_e(data.study)}</h1><p class='sub'>generated {generated} by tuner report</p>",
        "<h2>Summary</h2>",
        _summary(data),
        "<h2>Chosen config</h2>",
        _best_section(data),
        *(
            ["<h2>On your data: when a config would crash</h2>", f"<pre>{_e(chr(10).join(data.crash))}</pre>"]
            if data.crash
            else []
        ),
        "<h2>Throughput and memory</h2>",
        f'<div class="grid">{"".join(plots)}</div>',
        "<h2>Per-rank peak memory</h2>",
        _ranks_section(data, figures),
    ]
    if optuna_plots:
        parts += ["<h2>Optuna views</h2>", f'<div class="grid">{"".join(optuna_plots)}</div>']
    parts += [f"<h2>Study definition</h2><pre>{_e(definition)}</pre>", "</body></html>"]
    return "\n".join(parts)


def write_report(url: str, study: str, output: Path) -> Path:
    """Renders the report of ``study`` to ``output`` (parent folders must exist); returns the path written."""
    if output.exists() and output.is_dir():
        raise ConfigError(f"-o {output} is a directory; give a file name such as {output / 'report.html'}")
    if not output.parent.exists():
        raise ConfigError(f"-o {output}: folder {output.parent} does not exist; create it or choose another path")
    page = render_html(load(url, study))
    try:
        write_atomic(output, page)
    except OSError as err:
        raise ConfigError(f"cannot write the report to {output}: {err.strerror}; choose a writable path") from None
    return output
