"""The wall: each probe's throughput against the memory its fullest rank needed, beside the capacity and headroom lines
— where the configs that fit end and the out-of-memory ones begin.

An out-of-memory probe is drawn at the memory it NEEDED: what it had in use when an allocation was refused plus that
allocation (the probe records it: trials.contract.FailedAllocation; RankMemory.oom_need on the emulated device), a
lower bound that lies past the capacity line, never its pre-failure peak (which lies under it and reads as "fitted").
A config ruled out without running is drawn where the reason put it: the memory estimate's figure, or the need of
the measured config it needs at least as much as (the feasibility frontier). The pick is marked at its figure
(tuner.records.throughput). Pure: rows in, points and a plotly figure out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from tuner.records import Candidate, ProbeRow, ProbeStatus
from tuner.records.throughput import Throughput
from tuner.reporting.labels import compact, probe_label
from tuner.units import format_size

MiB = float(1 << 20)


def oom_need(row: ProbeRow) -> int | None:
    """After an OOM: the most any rank needed, in use + the allocation refused (None when no rank recorded it)."""
    needs = []
    for rank in row.measurement.ranks:
        failed = rank.failed_allocation
        asked = failed.live + failed.nbytes if failed is not None else 0
        needs.append(max(rank.oom_need or 0, asked))
    found = max(needs, default=0)
    return found or None


def memory_of(row: ProbeRow) -> int | None:
    """The memory a measured probe's fullest rank needed: an OOM's need (in use + refused; its pre-failure peak only
    when it recorded no refused allocation), else what the stability rule compares (ProbeRow.memory_need)."""
    if row.status == ProbeStatus.OOM:
        return oom_need(row) or row.memory_need
    return row.memory_need


@dataclass(frozen=True)
class Point:
    kind: str  # "stable", "over headroom", "oom", "ruled out"
    mib: float
    value: float  # throughput in the objective unit (0 for a config that did not run or ran out of memory)
    text: str  # the hover text (trial and config, what the point stands for)


def _oom_point(row: ProbeRow, job: Mapping[str, Any] | None) -> Point | None:
    need, before = oom_need(row), row.memory_need
    if need is None and before is None:
        return None
    what = (
        f"needed at least {format_size(need)} (in use + the refused allocation)"
        if need is not None
        else f"ran out after a peak of {format_size(before)} (no refused allocation recorded)"
    )
    return Point("oom", float(need or before or 0) / MiB, 0.0, f"{probe_label(row, job)}<br>out of memory: {what}")


def _ruled_point(row: ProbeRow, measured: Mapping[str, int], job: Mapping[str, Any] | None) -> Point | None:
    ruled = row.ruled_out_by
    if ruled is None:
        return None
    if ruled.estimate_bytes is not None:
        said = f"the memory estimate says {format_size(ruled.estimate_bytes)}"
        return Point("ruled out", ruled.estimate_bytes / MiB, 0.0, f"{probe_label(row, job)}<br>ruled out: {said}")
    label = compact(ruled.measured, job) if ruled.measured is not None else None
    need = measured.get(label) if label is not None else None
    if need is None:
        return None
    said = f"needs at least the memory of {label} ({format_size(need)}), which did not fit"
    return Point("ruled out", need / MiB, 0.0, f"{probe_label(row, job)}<br>ruled out: {said}")


def points(rows: Sequence[ProbeRow], job: Mapping[str, Any] | None = None) -> list[Point]:
    """A point per probe that ran with a memory figure, and per config ruled out with one."""
    out: list[Point] = []
    measured: dict[str, int] = {}
    for row in rows:
        if not row.measured:
            continue
        if row.status == ProbeStatus.OK and row.objective is not None and row.memory_need:
            kind = "stable" if row.stable else "over headroom"
            text = f"{probe_label(row, job)}<br>peak {format_size(row.memory_need)}"
            out.append(Point(kind, row.memory_need / MiB, float(row.objective), text))
        elif row.status == ProbeStatus.OOM:
            found = _oom_point(row, job)
            out += [found] if found is not None else []
        need = memory_of(row)
        if need and row.status in (ProbeStatus.OK, ProbeStatus.OOM):
            label = compact(row.knobs or {}, job)
            measured[label] = max(measured.get(label, 0), need)
    for row in rows:
        if row.status == ProbeStatus.INFERRED_OOM:
            found = _ruled_point(row, measured, job)
            out += [found] if found is not None else []
    return out


STYLE = {  # kind -> (legend name, marker)
    "stable": ("fits (stable)", {"symbol": "circle", "color": "#1f77b4", "size": 9}),
    "over headroom": ("fits, above the headroom", {"symbol": "circle-open", "color": "#ff7f0e", "size": 9}),
    "oom": ("out of memory, at what it needed", {"symbol": "x", "color": "#d62728", "size": 11}),
    "ruled out": ("ruled out without running", {"symbol": "x-open", "color": "#ff9896", "size": 10}),
}


def wall_figure(
    rows: Sequence[ProbeRow],
    capacity: int | None,
    headroom: float,
    unit: str,
    pick: tuple[Candidate, Throughput] | None = None,
    job: Mapping[str, Any] | None = None,
) -> go.Figure:
    """The wall: a trace per kind of point, the capacity and headroom lines, the pick as a star."""
    fig = go.Figure()
    found = points(rows, job)
    for kind, (name, marker) in STYLE.items():
        group = [p for p in found if p.kind == kind]
        if group:
            fig.add_trace(
                go.Scatter(
                    x=[p.mib for p in group],
                    y=[p.value for p in group],
                    mode="markers",
                    name=name,
                    marker=marker,
                    text=[p.text for p in group],
                    hoverinfo="text+x+y",
                )
            )
    if pick is not None:
        best, figure = pick
        need = max((memory_of(r) or 0 for r in best.rows), default=0) or best.peak_allocated
        fig.add_trace(
            go.Scatter(
                x=[need / MiB],
                y=[figure.value],
                mode="markers+text",
                name="the pick",
                marker={"symbol": "star", "color": "#2ca02c", "size": 18, "line": {"color": "#222", "width": 1}},
                text=["pick"],
                textposition="top center",
                hovertext=[f"the pick: t{best.trial_number} {compact(best.knobs, job)}<br>{figure.statistic()}"],
                hoverinfo="text+x+y",
            )
        )
    if capacity:
        fig.add_vline(x=capacity / MiB, line={"color": "#d62728"}, annotation_text="capacity")
        fig.add_vline(
            x=headroom * capacity / MiB,
            line={"color": "#ff7f0e", "dash": "dash"},
            annotation_text=f"headroom {headroom:.0%}",
            annotation_position="bottom left",
        )
    fig.update_layout(
        title="The wall: throughput against the memory of the fullest rank",
        xaxis_title="memory per rank, MiB (an OOM: in use + the refused allocation)",
        yaxis_title=unit,
        template="plotly_white",
        height=460,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


__all__ = ["Point", "memory_of", "oom_need", "points", "wall_figure"]
