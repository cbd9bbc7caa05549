"""The user's real training runs beside what the probes predicted: each production row (recorded by
tuner.integrations.transformers.TunerCallback) with the probes of the same config. `tuner trials`, the report and
``GET /best-config`` show these. Pure: the callers hand the study's rows in."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from tuner.memory.frontier import describe
from tuner.records import Fidelity, ProbeRow, ProbeStatus
from tuner.records.production import ProductionResult
from tuner.units import format_size


@dataclass(frozen=True)
class ProductionRun:
    row: ProbeRow
    probed_peak: int | None  # the highest peak the probes of this config measured
    probed_samples_per_s: float | None  # their median throughput

    @property
    def recorded(self) -> ProductionResult:
        """What the run recorded beside the row's columns (rank, device, steps, phase, what the peak is)."""
        return self.row.production or ProductionResult()

    @property
    def memory_kind(self) -> str:
        return self.recorded.memory

    def line(self) -> str:
        r, rec = self.row, self.recorded
        where = f"rank {rec.rank} on {rec.device or '?'}"
        verdict = str(r.status) if r.status == ProbeStatus.OK else f"{r.status}: {r.cause or 'no cause recorded'}"
        if r.status != ProbeStatus.OK and rec.phase:
            verdict += f" (in {rec.phase})"
        peak = f"peak {format_size(r.peak_allocated)} ({self.memory_kind})"
        if self.probed_peak is not None:
            peak += f", probed {format_size(self.probed_peak)}"
        speed = ""
        if r.samples_per_s:
            speed = f", {r.samples_per_s:.3g} samples/s"
            if self.probed_samples_per_s:
                speed += f" (probed {self.probed_samples_per_s:.3g})"
        return f"production run, {where}: {verdict}; {peak}{speed}; {describe(r.knobs)}"


def production_runs(rows: Iterable[ProbeRow], config_key: str | None = None) -> list[ProductionRun]:
    """Every production row (of ``config_key`` only, when given) with its config's probe evidence, oldest first."""
    rows = list(rows)
    out: list[ProductionRun] = []
    for row in rows:
        if row.fidelity != Fidelity.PRODUCTION or (config_key is not None and row.config_key != config_key):
            continue
        probes = [r for r in rows if r.measured and r.config_key == row.config_key and r.status == ProbeStatus.OK]
        peaks = [int(r.peak_allocated) for r in probes if r.peak_allocated is not None]
        speeds = [float(r.samples_per_s) for r in probes if r.samples_per_s]
        out.append(ProductionRun(row, max(peaks) if peaks else None, statistics.median(speeds) if speeds else None))
    return out
