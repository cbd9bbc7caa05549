"""The report's and the dashboard's trial table: one row per probe that ran or config ruled out, in trial order, with
its status, throughput, the memory its fullest rank needed (an OOM's in use + refused allocation), its per-phase peaks,
seconds, config and cause. Every stored string is escaped. Pure string building."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from trials.contract import MEMORY_PHASES
from tuner.records import Candidate, ProbeRow, ProbeStatus
from tuner.records.throughput import Throughput, number
from tuner.reporting.labels import compact
from tuner.reporting.wall import memory_of, oom_need
from tuner.units import format_size

LONG_CAUSE = 240  # a longer cause (an error's stderr) folds into <details>; a refusal is short and shown whole


def e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _memory(row: ProbeRow) -> str:
    if row.status == ProbeStatus.OOM:
        need = oom_need(row)
        return f"\u2265 {format_size(need)} needed" if need else f"{format_size(row.memory_need)} before the OOM"
    if row.status == ProbeStatus.INFERRED_OOM and row.estimate_bytes:
        return f"estimate {format_size(row.estimate_bytes)}"
    return format_size(memory_of(row)) if memory_of(row) else "-"


def _phases(row: ProbeRow) -> str:
    peaks = row.measurement.phase_peaks
    return " / ".join(f"{p.replace('_', ' ')} {format_size(peaks[p])}" for p in MEMORY_PHASES if p in peaks) or "-"


def _cause(row: ProbeRow) -> str:
    text = " ".join((row.cause or "").split())
    if len(text) <= LONG_CAUSE or row.status == ProbeStatus.REFUSED:
        return e(text)
    return f"<details><summary>{e(text[:120])}\u2026</summary>{e(text)}</details>"


def _trial(row: ProbeRow) -> str:
    number_ = "-" if row.trial_number is None else str(row.trial_number)
    return number_ if row.fidelity.value == "short" else f"{number_} {row.fidelity.value}"


HEADINGS = ("trial", "status", "{unit}", "memory per rank", "peak per phase", "s", "config", "cause")


def trial_table(
    rows: Sequence[ProbeRow],
    unit: str,
    pick: tuple[Candidate, Throughput] | None = None,
    job: Mapping[str, Any] | None = None,
) -> str:
    """The table: the pick's probes marked (class "pick"; the pick's figure in its own line above, as every face
    shows it), failures with their cause."""
    keys = {pick[0].config_key} if pick is not None else set()
    ordered = sorted(
        (r for r in rows if r.measured or r.status == ProbeStatus.INFERRED_OOM),
        key=lambda r: (r.trial_number is None, r.trial_number or 0, r.id or 0),
    )
    head = "".join(f"<th>{e(h.format(unit=unit))}</th>" for h in HEADINGS)
    body = []
    for row in ordered:
        status = row.status.value + ("" if row.status != ProbeStatus.OK or row.stable else " unstable")
        cells = (
            e(_trial(row)),
            e(status),
            e(number(row.objective) if row.objective is not None else "-"),
            e(_memory(row)),
            e(_phases(row)),
            e(f"{row.probe_seconds:.0f}" if row.probe_seconds else "-"),
            e(compact(row.knobs or {}, job) or "-"),
            _cause(row),
        )
        mark = ' class="pick"' if row.config_key in keys and row.measured else ""
        tds = "".join(f"<td>{c}</td>" for c in cells)
        body.append(f"<tr{mark} data-status='{e(row.status.value)}'>{tds}</tr>")
    note = ""
    if pick is not None:
        figure = pick[1]
        note = (
            f'<p class="pick-note">Highlighted: the pick\'s probes; its figure is {e(figure.text(unit))}, '
            f"{e(figure.statistic())}.</p>"
        )
    table = f'<table class="trials"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    return note + table if body else '<p class="empty">No probes yet.</p>'


__all__ = ["e", "trial_table"]
