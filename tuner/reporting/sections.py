"""The sections of a study's page, shared by `tuner report` (one self-contained file) and the dashboard at `/` (served
pages): summary, the pick and its exports, the wall, per-phase and per-rank peaks, the trial table, Optuna's views, the
study definition folded. Plotly figures become divs that draw with the plotly.js the page loads once (the report
inlines it, the dashboard serves it); every stored string is escaped. Pure string building over ReportData."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from tuner.interop.export.changes import engine_name
from tuner.memory.imbalance import rank_imbalance
from tuner.records import Fidelity
from tuner.reporting import figures as figs
from tuner.reporting.table import e, trial_table
from tuner.reporting.wall import wall_figure

if TYPE_CHECKING:
    from tuner.reporting.data import ReportData

MiB = float(1 << 20)

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{margin-bottom:4px} .sub{color:#666;margin-top:0} table{border-collapse:collapse;margin:8px 0 16px}
td,th{border:1px solid #ddd;padding:4px 8px;text-align:left;font-size:14px;vertical-align:top} th{background:#f4f4f4}
pre{background:#f7f7f7;padding:10px;overflow-x:auto;font-size:13px} .flag{color:#b00020;font-weight:600}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:12px} .card{border:1px solid #eee;border-radius:6px;padding:6px}
.empty{color:#888;font-style:italic} details{margin:6px 0} tr.pick td{background:#eaf6ea;font-weight:600}
.trials td{font-size:13px} .trials td:nth-child(7){white-space:nowrap} .big{font-size:20px;font-weight:600}
button.copy{float:right;font-size:12px}
"""

#: the copy buttons of the exports (and the dashboard's commands): the clipboard where the page may use it (localhost,
#: https, a file), else the text selected and copied the old way
COPY_SCRIPT = """document.addEventListener('click', function (ev) {
  var b = ev.target.closest ? ev.target.closest('button.copy') : null;
  var pre = b ? document.getElementById(b.getAttribute('data-copy')) : null;
  if (!pre) return;
  function done() { b.textContent = 'copied'; setTimeout(function () { b.textContent = 'copy'; }, 1500); }
  function select() {
    var r = document.createRange(); r.selectNodeContents(pre);
    var s = window.getSelection(); s.removeAllRanges(); s.addRange(r);
    try { document.execCommand('copy'); } catch (e) { /* selected: the user copies it */ }
    done();
  }
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(pre.textContent).then(done, select);
  else select();
});"""


class Figures:
    """Turns figures into divs (ids "plot-N", or the one given); the page loads plotly.js once, before them."""

    def __init__(self) -> None:
        self.count = 0

    def div(self, fig: go.Figure | None, empty: str = "nothing to plot yet", div_id: str | None = None) -> str:
        if fig is None or not fig.data:
            return f'<div class="card empty">{e(empty)}</div>'
        self.count += 1
        inner = fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=div_id or f"plot-{self.count}",
            config={"displaylogo": False, "responsive": True},
        )
        return f'<div class="card plot">{inner}</div>'


def table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def summary(data: ReportData) -> str:
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
    return table(["", ""], items)


def exports(data: ReportData) -> str:
    """Each export in a folded block with a copy button (the button needs a page script: the dashboard has one)."""
    return "".join(
        f"<details{' open' if i == 0 else ''}><summary>{e(fmt)}</summary>"
        f'<button class="copy" type="button" data-copy="export-{e(fmt)}">copy</button>'
        f'<pre id="export-{e(fmt)}">{e(text)}</pre></details>'
        for i, (fmt, text) in enumerate(data.exports.items())
    )


def best(data: ReportData) -> str:
    pick = data.pick
    if pick is None:
        return (
            '<p class="empty">No stable config yet: no probe finished under the headroom without allocator retries.</p>'
        )
    found, figure = pick
    peak = f"{found.peak_allocated / MiB:,.1f} MiB"
    if found.capacity:
        peak += f" ({found.peak_allocated / found.capacity:.0%} of capacity)"
    head = (
        f'<p class="big" id="pick-figure">{e(figure.text(data.unit))}</p>'
        f'<p class="sub">{e(figure.statistic())}: the figure `tuner best`, `tuner trials`, the API and the search '
        "summary show for it" + (f"; {e(data.verdict)}" if data.verdict else "") + "</p>"
    )
    facts: list[list[Any]] = [
        ["engine", engine_name(found.knobs)],
        ["samples/s", f"{figure.samples_per_s:,.2f}"],
        ["peak allocated", peak],
        ["confirmed (re-probed longer)", "yes" if found.confirmed else "no"],
        ["measurements", found.measurements],
        ["trial", found.trial_number],
    ]
    knobs: list[list[Any]] = [[k, v] for k, v in sorted(found.knobs.items()) if v is not None]
    changes = "<h3>Changes to your files</h3><pre>" + e("\n".join(data.changes)) + "</pre>" if data.changes else ""
    if data.production:
        changes += "<h3>Your training runs</h3><pre>" + e("\n".join(data.production)) + "</pre>"
    return head + table(["", ""], facts) + table(["knob", "value"], knobs) + changes + "<h3>Export</h3>" + exports(data)


def ranks(data: ReportData, figures: Figures) -> str:
    lines: list[list[Any]] = []
    for row in data.rows:
        imb = rank_imbalance(row.measurement.ranks)
        if imb is None:
            continue
        peaks = ", ".join(f"r{r}: {p / MiB:,.1f}" for r, p in imb.peaks.items())
        lines.append([row.id, row.trial_number, row.status, peaks, imb.summary()])
    if not lines:
        return '<p class="empty">No multi-rank probes in this study.</p>'
    found = table(["probe", "trial", "status", "peak MiB per rank", "imbalance"], lines)
    found = found.replace("<td>IMBALANCE", '<td class="flag">IMBALANCE')
    causes = sorted(
        {c for row in data.rows if (i := rank_imbalance(row.measurement.ranks)) and i.flagged for c in i.causes}
    )
    hint = "".join(f"<li>{e(c)}</li>" for c in causes)
    hint = f"<p>Likely causes of the flagged spreads:</p><ul>{hint}</ul>" if hint else ""
    return figures.div(figs.rank_peaks(data.rows, data.job), div_id="ranks") + found + hint


def plots(data: ReportData, figures: Figures) -> list[str]:
    rows = data.rows
    out = [
        figures.div(figs.throughput_over_time(rows), "no measured probes yet", div_id="over-time"),
        figures.div(
            figs.memory_vs_micro_batch(rows, data.capacity, data.headroom), "no peak memory recorded yet", "memory"
        ),
    ]
    phases = figs.phase_peaks(rows, data.job)
    if phases is not None:  # rows stored with per-phase peaks (train, eval forward, generate)
        out.append(figures.div(phases, div_id="phases"))
    if len({r.knobs.get("max_length") for r in rows if r.knobs}) > 1:  # a frontier over lengths needs two of them
        out.append(figures.div(figs.oom_frontier(rows), "no configs tried yet", div_id="frontier"))
    return out


def body(data: ReportData, figures: Figures, optuna_figures: Sequence[go.Figure] = ()) -> list[str]:
    """Every section of the study's page, in reading order."""
    wall = wall_figure(data.rows, data.capacity, data.headroom, data.unit, data.pick, data.job)
    definition = json.dumps(data.definition.to_json(), indent=2, sort_keys=True, default=str)
    parts = [
        "<h2>Summary</h2>",
        summary(data),
        "<h2>Chosen config</h2>",
        best(data),
        *(
            ["<h2>On your data: when a config would crash</h2>", f"<pre>{e(chr(10).join(data.crash))}</pre>"]
            if data.crash
            else []
        ),
        "<h2>The wall</h2>",
        figures.div(wall, "no probe has a memory figure yet", div_id="wall"),
        "<h2>Throughput and memory</h2>",
        f'<div class="grid">{"".join(plots(data, figures))}</div>',
        "<h2>Per-rank peak memory</h2>",
        ranks(data, figures),
        "<h2>Trials</h2>",
        trial_table(data.rows, data.unit, data.pick, data.job),
    ]
    if optuna_figures:
        grid = "".join(figures.div(f) for f in optuna_figures)
        parts += ["<h2>Optuna views</h2>", f'<div class="grid">{grid}</div>']
    parts.append(
        "<h2>Study definition</h2><details><summary>what the study searched (JSON)</summary>"
        f"<pre>{e(definition)}</pre></details>"
    )
    return parts


__all__ = ["COPY_SCRIPT", "CSS", "Figures", "body", "table"]
