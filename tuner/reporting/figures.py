"""The report's plotly figures, each built from stored probe rows (tuner.storage.schema.probes) — pure, no I/O."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from trials.contract import MEMORY_PHASES
from tuner.memory.imbalance import rank_imbalance
from tuner.records import ProbeRow, ProbeStatus
from tuner.reporting.labels import probe_label
from tuner.reporting.wall import memory_of

MiB = float(1 << 20)
OOM_STATUSES = (ProbeStatus.OOM, ProbeStatus.INFERRED_OOM)
STATUS_STYLE: dict[str, tuple[str, str]] = {  # status -> (marker symbol, colour)
    "ok": ("circle", "#1f77b4"),
    "oom": ("x", "#d62728"),
    "inferred-oom": ("x-open", "#ff9896"),
    "timeout": ("triangle-up", "#9467bd"),
    "error": ("diamond", "#7f7f7f"),
}
STAGE_COLOURS = ("#1f77b4", "#2ca02c", "#ff7f0e", "#d62728")


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        template="plotly_white",
        height=420,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def _knob(row: ProbeRow, name: str, default: Any = None) -> Any:
    knobs = row.knobs or {}
    return knobs.get(name, default)


def _hover(row: ProbeRow) -> str:
    knobs = row.knobs or {}
    parts = [f"{k}={v}" for k, v in sorted(knobs.items()) if v is not None]
    head = f"trial {row.trial_number} · {row.fidelity} · {row.status}"
    cause = " ".join(str(row.cause or "").split())
    tail = "<br>cause: " + "<br>".join(textwrap.wrap(cause, 100)) if cause else ""  # whole, wrapped
    return head + "<br>" + "<br>".join(parts) + tail


def throughput_over_time(rows: Sequence[ProbeRow]) -> go.Figure:
    """Each probe's throughput at its finish time, by status; failures sit at 0. Plus the best-so-far line."""
    fig = go.Figure()
    measured = [r for r in rows if r.measured]
    by_status: dict[str, list[ProbeRow]] = defaultdict(list)
    for row in measured:
        by_status[str(row.status)].append(row)
    for status, group in sorted(by_status.items()):
        symbol, colour = STATUS_STYLE.get(status, ("circle", "#333"))
        fig.add_trace(
            go.Scatter(
                x=[r.created_at for r in group],
                y=[float(r.samples_per_s or 0.0) for r in group],
                mode="markers",
                name=status,
                marker={"symbol": symbol, "color": colour, "size": 9},
                text=[_hover(r) for r in group],
                hoverinfo="text+y",
            )
        )
    best, xs, ys = 0.0, [], []
    for row in sorted(measured, key=lambda r: (r.created_at is not None, r.created_at or 0, r.id or 0)):
        if row.stable and row.samples_per_s:
            best = max(best, float(row.samples_per_s))
        if best:
            xs.append(row.created_at)
            ys.append(best)
    if xs:
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines", line={"shape": "hv", "color": "#2ca02c"}, name="best stable")
        )
    return _layout(fig, "Throughput per probe over time", "finished at", "samples/s (global batch)")


def memory_vs_micro_batch(rows: Sequence[ProbeRow], capacity: int | None, headroom: float) -> go.Figure:
    """The memory of the fullest rank against micro batch per ZeRO stage, with capacity and headroom lines; an OOM
    at what it needed (in use + the refused allocation: tuner.reporting.wall.memory_of), not its pre-failure peak."""
    fig = go.Figure()
    measured = [r for r in rows if r.measured and memory_of(r)]
    for stage in sorted({int(_knob(r, "zero_stage", 0) or 0) for r in measured}):
        group = [r for r in measured if int(_knob(r, "zero_stage", 0) or 0) == stage]
        fig.add_trace(
            go.Scatter(
                x=[_knob(r, "micro_batch_size") for r in group],
                y=[(memory_of(r) or 0) / MiB for r in group],
                mode="markers",
                name=f"ZeRO-{stage}",
                marker={
                    "color": STAGE_COLOURS[stage % len(STAGE_COLOURS)],
                    "symbol": [STATUS_STYLE.get(str(r.status), ("circle", ""))[0] for r in group],
                    "size": 9,
                },
                text=[_hover(r) for r in group],
                hoverinfo="text+y",
            )
        )
    if capacity:
        fig.add_hline(y=capacity / MiB, line={"color": "#d62728", "dash": "solid"}, annotation_text="capacity")
        fig.add_hline(
            y=headroom * capacity / MiB,
            line={"color": "#ff7f0e", "dash": "dash"},
            annotation_text=f"headroom {headroom:.0%}",
            annotation_position="bottom right",
        )
    fig.update_xaxes(type="log", dtick=0.30102999566)
    return _layout(fig, "Peak memory vs micro batch", "micro batch size (log)", "memory per rank (MiB; OOM: needed)")


def oom_frontier(rows: Sequence[ProbeRow]) -> go.Figure:
    """Every config tried in the (micro batch, max_length) plane per ZeRO stage; the line is the largest micro batch
    that fitted at each max_length."""
    fig = go.Figure()
    tried = [r for r in rows if _knob(r, "micro_batch_size") is not None]
    stages = sorted({int(_knob(r, "zero_stage", 0) or 0) for r in tried})
    for stage in stages:
        group = [r for r in tried if int(_knob(r, "zero_stage", 0) or 0) == stage]
        colour = STAGE_COLOURS[stage % len(STAGE_COLOURS)]
        fits = [r for r in group if r.status == ProbeStatus.OK]
        ooms = [r for r in group if r.status in OOM_STATUSES]
        for label, members, symbol in (("fits", fits, "circle"), ("OOM", ooms, "x")):
            if members:
                fig.add_trace(
                    go.Scatter(
                        x=[_knob(r, "micro_batch_size") for r in members],
                        y=[_knob(r, "max_length") for r in members],
                        mode="markers",
                        name=f"ZeRO-{stage} {label}",
                        marker={"color": colour, "symbol": symbol, "size": 10},
                        text=[_hover(r) for r in members],
                        hoverinfo="text",
                    )
                )
        largest: dict[int, int] = {}
        for row in fits:
            length, micro = int(_knob(row, "max_length")), int(_knob(row, "micro_batch_size"))
            largest[length] = max(micro, largest.get(length, 0))
        if largest:
            lengths = sorted(largest)
            fig.add_trace(
                go.Scatter(
                    x=[largest[n] for n in lengths],
                    y=lengths,
                    mode="lines",
                    line={"color": colour, "dash": "dot"},
                    name=f"ZeRO-{stage} frontier",
                )
            )
    fig.update_xaxes(type="log", dtick=0.30102999566)
    return _layout(fig, "OOM frontier: what fits and what does not", "micro batch size (log)", "max_length")


def _unique(label: str, row: ProbeRow, taken: Sequence[str]) -> str:
    """A bar's category name: a second probe of the same trial and config gets its probe id (plotly would stack
    both on one category)."""
    return label if not any(t == label or t.startswith(label + " r") for t in taken) else f"{label} #{row.id}"


def rank_peaks(rows: Iterable[ProbeRow], job: Mapping[str, Any] | None = None) -> go.Figure | None:
    """Grouped bars of each rank's peak for multi-rank probes; flagged (imbalanced) probes are named with a '!'."""
    labels: list[str] = []
    per_rank: dict[int, list[float | None]] = defaultdict(list)
    for row in rows:
        imb = rank_imbalance(row.measurement.ranks)
        if imb is None:
            continue
        label = _unique(probe_label(row, job), row, labels) + (" !" if imb.flagged else "")
        labels.append(label)
        for rank in set(per_rank) | set(imb.peaks):
            per_rank[rank].extend([None] * (len(labels) - 1 - len(per_rank[rank])))
            per_rank[rank].append(imb.peaks[rank] / MiB if rank in imb.peaks else None)
    if not labels:
        return None
    fig = go.Figure()
    for rank in sorted(per_rank):
        fig.add_trace(go.Bar(x=labels, y=per_rank[rank], name=f"rank {rank}"))
    fig.update_layout(barmode="group")
    return _layout(fig, "Peak memory per rank (probes marked ! are imbalanced > 20%)", "probe", "peak allocated (MiB)")


def phase_peaks(rows: Iterable[ProbeRow], job: Mapping[str, Any] | None = None) -> go.Figure | None:
    """Grouped bars of each measured probe's peak per phase of its memory window (train, eval forward, generate:
    ProbeRow.measurement.phase_peaks, the most over ranks); a probe whose ranks' phase peaks differ gets one bar group
    per rank ("r1"). Each probe is named by its trial and config ("t12 micro=4 z2", "confirm micro=4 z2"). None when
    no row stored phases (rows from before per-phase peaks show nothing, never a guess)."""
    labels: list[str] = []
    bars: dict[str, list[float | None]] = defaultdict(list)
    for row in rows:
        measured = row.measurement
        if not measured.phase_peaks:
            continue
        base = _unique(probe_label(row, job), row, labels)
        groups = [(f"{base} r{r.rank}", r.phases) for r in measured.ranks] if measured.ranks_differ else []
        for label, peaks in groups or [(base, measured.phase_peaks)]:
            labels.append(label)
            for phase, peak in peaks.items():
                bars[phase].extend([None] * (len(labels) - 1 - len(bars[phase])))
                bars[phase].append(peak / MiB)
    if not labels:
        return None
    fig = go.Figure()
    for phase in MEMORY_PHASES:
        if phase in bars:
            values = bars[phase] + [None] * (len(labels) - len(bars[phase]))
            fig.add_trace(go.Bar(x=labels, y=values, name=phase.replace("_", " ")))
    fig.update_layout(barmode="group")
    return _layout(fig, "Peak memory per phase of each probe (per rank where the ranks differ)", "probe", "MiB")
