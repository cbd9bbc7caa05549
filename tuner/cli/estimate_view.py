"""What `tuner estimate` prints: every phase's peak per rank, part by part, the largest allocations of the peak
phase, the verdict against the device memory, and what the estimate does not cover (text or JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from tuner.cli.safe_console import SafeConsole
from tuner.memory.breakdown import PARTS, Breakdown, PhaseEstimate, RankEstimate
from tuner.memory.estimator import Estimate

MiB = 1 << 20


@dataclass(frozen=True)
class Shown:
    """One estimate as printed."""

    result: Estimate
    accumulates: bool
    param_count: int
    trainable_count: int | None
    capacity: int | None
    margin: float
    calibration_probes: int
    calibration_errors: list[float]
    header: str  # the job and config in a line
    traced: str  # how the trace was taken (exact, or extrapolated from short lengths)
    solved: str | None = None  # the --solve answer, in a line
    config: dict[str, Any] | None = None  # the knobs estimated (Knobs.model_dump)
    data: tuple[str, ...] = ()  # with --dataset: the data's lengths and where the job's came from
    crash: str | None = None  # with --dataset and --device-memory: when this config would crash on the data
    precision: str = ""  # which precision mode the trace ran, and why (tuner.memory.precision)


def verdict(shown: Shown) -> str | None:
    if shown.capacity is None:
        return None
    return "fits" if shown.result.calibrated * (1 + shown.margin) <= shown.capacity else "over budget"


def phase_json(p: PhaseEstimate) -> dict[str, Any]:
    return {
        "phase": p.phase,
        "total": p.total,
        "parts": [
            {
                "name": part.name,
                "bytes": part.nbytes,
                "note": part.note,
                "largest": [
                    {"op": a.op, "shape": list(a.shape), "dtype": a.dtype, "bytes": a.nbytes, "traced_at": a.traced_at}
                    for a in part.largest
                ],
            }
            for part in p.parts
        ],
    }


def as_json(shown: Shown) -> str:
    r = shown.result
    parts: Breakdown | None = r.breakdown
    out: dict[str, Any] = {
        "param_count": shown.param_count,
        "trainable_count": shown.trainable_count,
        "params": r.states.params,
        "grads": r.states.grads,
        "optimizer": r.states.optimizer,
        "buffers": r.states.buffers,
        "activations": r.activations,
        "gradient_accumulation": shown.accumulates,
        "raw": r.raw,
        "calibrated": r.calibrated,
        "calibration": list(r.calibration),
        "calibration_probes": shown.calibration_probes,
        "capacity": shown.capacity,
        "verdict": verdict(shown),
        "peak_phase": parts.worst.peak.phase if parts else None,
        "ranks": [
            {"rank": rank.rank, "phases": [phase_json(p) for p in rank.phases]}
            for rank in (parts.ranks if parts else ())
        ],
        "not_covered": parts.not_covered if parts else None,
        "traced": shown.traced,
        "precision_traced": shown.precision,
        "solved": shown.solved,
        "config": shown.config,
        "data": list(shown.data),
        "crash": shown.crash,
    }
    return json.dumps(out)


def print_text(shown: Shown) -> None:
    r = shown.result
    parts = r.breakdown
    assert parts is not None
    lora = ""
    if shown.trainable_count is not None and shown.trainable_count < shown.param_count:
        lora = f", {shown.trainable_count:,} of them LoRA adapters that train"
    console = SafeConsole(highlight=False, width=110)
    console.print(f"{shown.header}\n{shown.param_count / 1e6:,.1f}M params{lora}; {shown.traced}", markup=False)
    if shown.precision:
        console.print(shown.precision, markup=False)
    for line in shown.data:
        console.print(line, markup=False)
    for rank in parts.ranks:
        _print_rank(console, rank)
    lines = []
    if shown.calibration_probes:
        a, b, c = r.calibration
        errs = shown.calibration_errors
        lines.append(
            f"calibrated: {r.calibrated / MiB:,.1f} MiB (fit to {len(errs)} probes: {a:.2f}*states + {b:.2f}*rest + "
            f"{c / MiB:.0f} MiB, max err {max(map(abs, errs)):.0%})"
        )
    if shown.capacity is not None:
        lines.append(
            f"device memory {shown.capacity / MiB:,.1f} MiB: {verdict(shown)} (with {shown.margin:.0%} margin)"
        )
    lines += [shown.solved or "", shown.crash or "", parts.not_covered]
    for line in lines:
        if line:
            console.print(line, markup=False)


def _print_rank(console: Console, rank: RankEstimate) -> None:
    t = Table(title="peak device memory per rank, MiB" + ("" if rank.rank is None else f" (rank {rank.rank})"))
    t.add_column("part")
    for p in rank.phases:
        t.add_column(p.title, justify="right")
    present = {part.name for p in rank.phases for part in p.parts}
    for name in (n for n in PARTS if n in present):
        t.add_row(name, *(_cell(p, name) for p in rank.phases))
    t.add_row("phase peak", *(f"{p.total / MiB:,.1f}" for p in rank.phases))
    console.print(t)
    peak = rank.peak
    console.print(f"peak: {peak.title}, {peak.total / MiB:,.1f} MiB (uncalibrated)", markup=False)
    for part in peak.parts:
        for alloc in part.largest:
            console.print(f"  largest: {alloc.describe()}", markup=False)
        if part.note:
            console.print(f"  {part.name}: {part.note}", markup=False)


def _cell(p: PhaseEstimate, name: str) -> str:
    found = [part for part in p.parts if part.name == name]
    if not found:
        return "-"
    text = f"{found[0].nbytes / MiB:,.1f}"
    return text + (" (host)" if found[0].note.startswith("host") else "")


def emit(shown: Shown, json_out: bool) -> None:
    if json_out:
        typer.echo(as_json(shown))
    else:
        print_text(shown)
