"""A stable config as selection ranks it (tuner.search.selection.candidates): what every face hands out as the best
config, with the probe rows it rests on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tuner.records.probe import ProbeRow


@dataclass(frozen=True)
class Candidate:
    config_key: str
    knobs: dict[str, Any]
    config: dict[str, Any]
    objective: float  # measured, conservative: the lower of median and (mean - 1 std) over its measurements
    samples_per_s: float
    peak_allocated: int
    capacity: int | None
    confirmed: bool
    measurements: int
    trial_number: int | None
    rows: list[ProbeRow] = field(default_factory=list, repr=False)
    score: float = 0.0  # the rank: lower bound of log throughput given the model of every probe and its own
    upper: float = 0.0  # the matching upper bound (posterior mean + 1 std): could it still beat the leader?

    @property
    def fingerprints(self) -> list[dict[str, Any]]:
        """The hardware/environment fingerprint of each of its probes (trials.fingerprint)."""
        return [dict(r.measurement.fingerprint) for r in self.rows if r.result]


__all__ = ["Candidate"]
