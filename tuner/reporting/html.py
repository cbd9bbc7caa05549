"""`tuner report`: one self-contained HTML page of a study — the chosen config and its exports, the wall (throughput
against memory per rank, OOMs at what they needed, ruled-out configs where the estimate or the frontier put them, the
pick marked), per-phase and per-rank peaks, the trial table, the study definition folded; plotly.js inlined once
(tuner.reporting.plotly_js: the basic bundle, 1.2 MB). The dashboard at `/` (api.dashboard) shows the same sections.
Every stored string is HTML-escaped before it reaches the page."""

from __future__ import annotations

import datetime as dt
import html
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

from tuner.errors import ConfigError
from tuner.files import write_atomic
from tuner.reporting.data import ReportData, load, load_rows
from tuner.reporting.plotly_js import plotly_script
from tuner.reporting.sections import COPY_SCRIPT, CSS, Figures, body


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


def page(title: str, parts: list[str], script: str, extra_head: str = "") -> str:
    """An HTML page: ``script`` (a <script> element loading plotly.js, inline or served) once in the head, before
    every figure's div."""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>',
            f'<link rel="icon" href="data:,"><style>{CSS}</style>{extra_head}{script}</head><body>',
            *parts,
            "</body></html>",
        ]
    )


def render_html(data: ReportData) -> str:
    """The self-contained report: plotly.js (tuner.reporting.plotly_js) inlined once, no network needed."""
    optuna_figures = _optuna_figures(data.optuna_study) if data.optuna_study is not None else []
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = [f"<h1>Study {html.escape(data.study)}</h1><p class='sub'>generated {generated} by tuner report</p>"]
    parts = [*head, *body(data, Figures(), optuna_figures), f"<script>{COPY_SCRIPT}</script>"]
    script = f'<script type="text/javascript">{plotly_script()}</script>'
    return page(f"tuner report: {data.study}", parts, script)


def write_report(url: str, study: str, output: Path) -> Path:
    """Renders the report of ``study`` to ``output`` (parent folders must exist); returns the path written."""
    if output.exists() and output.is_dir():
        raise ConfigError(f"-o {output} is a directory; give a file name such as {output / 'report.html'}")
    if not output.parent.exists():
        raise ConfigError(f"-o {output}: folder {output.parent} does not exist; create it or choose another path")
    text = render_html(load(url, study))
    try:
        write_atomic(output, text)
    except OSError as err:
        raise ConfigError(f"cannot write the report to {output}: {err.strerror}; choose a writable path") from None
    return output


__all__ = ["ReportData", "load", "load_rows", "page", "render_html", "write_report"]
