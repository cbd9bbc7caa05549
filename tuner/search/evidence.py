"""What the search knows: every probe row so far (this worker's and, through the database, the other workers'), what
those rows taught the feasibility frontier and the memory estimate, and what that says about a config not yet probed.

Pure: no Optuna, no storage. The strategy (tuner.search.strategy) keeps one ``Evidence``; the proposers
(tuner.search.proposers) and the confirm phase (tuner.search.confirm) only read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from trials.contract import Knobs
from tuner.errors import TunerError
from tuner.memory.frontier import Frontier, device_fits
from tuner.records import Candidate, Fidelity, ProbeRow, ProbeStatus
from tuner.records.ruled_out import RuledOutBy
from tuner.search.selection import best_stable


class EstimatorLike(Protocol):
    """tuner.memory.estimator.Estimator: predicted peak bytes per rank, recalibrated on every measured peak."""

    def predict(self, knobs: Knobs) -> Any: ...  # an object with ``.calibrated`` bytes

    def observe(self, knobs: Knobs, measured_peak: int) -> None: ...


def fits(row: ProbeRow) -> bool | None:
    """What a measured row tells the frontier: fits (stable), does not fit (OOM or above the headroom), or nothing."""
    return device_fits(row.status.value, row.stable)


@dataclass(frozen=True)
class Inference:
    """What the evidence says about a config before probing it: ``verdict`` "oom" (never run it) or None (probe)."""

    verdict: str | None
    cause: str | None = None
    estimate: int | None = None  # the calibrated memory estimate, bytes, when there is one
    ruled_out_by: RuledOutBy | None = None  # with verdict "oom": what rules it out, as data


@dataclass
class Evidence:
    frontier: Frontier = field(default_factory=Frontier)  # e.g. Frontier(stage_need=...) to order ZeRO stages
    estimator: EstimatorLike | None = None
    device_memory: int | None = None
    estimate_margin: float = 1.5  # a config estimated above margin x capacity is ruled out

    def __post_init__(self) -> None:
        self.rows: list[ProbeRow] = []
        self.skipped: set[str] = set()  # configs another worker holds a claim on
        self._in_frontier: set[str] = set()

    # -- learning ----------------------------------------------------------------------------------------------------
    def load(self, rows: list[ProbeRow]) -> None:
        """Replaces the known probe rows (e.g. with the database's, including other workers')."""
        self.rows = list(rows)
        for row in self.rows:
            self._learn(row)

    def add(self, row: ProbeRow) -> None:
        self.rows.append(row)
        self._learn(row)

    def _learn(self, row: ProbeRow) -> None:
        key = row.config_key
        if not row.measured or key in self._in_frontier:
            return
        verdict = fits(row)
        if verdict is None:
            return  # timeouts and errors say nothing about memory
        self.frontier.add(row.knobs, fits=verdict)
        self._in_frontier.add(key)
        need = row.memory_need  # what the stability rule compares: the estimate calibrates on the same quantity
        if row.status == ProbeStatus.OK and need and self.estimator is not None:
            try:
                self.estimator.observe(Knobs.model_validate(row.knobs), int(need))
            except TunerError:  # a config the trace has no point for (an untraced FSDP2 kind): not calibrated on
                pass

    def use_frontier(self, frontier: Frontier) -> None:
        """Swaps in another frontier (e.g. one ordering ZeRO stages) and feeds it every measurement so far."""
        self.frontier = frontier
        fed: set[str] = set()
        for row in self.rows:
            key = row.config_key
            if row.measured and key in self._in_frontier and key not in fed:
                fed.add(key)
                verdict = fits(row)
                if verdict is not None:
                    frontier.add(row.knobs, fits=verdict)

    # -- reading -----------------------------------------------------------------------------------------------------
    def measured(self, key: str) -> ProbeRow | None:
        """The first measured row of ``key``, else its inferred row (so an inference is recorded once)."""
        inferred = None
        for row in self.rows:
            if row.config_key == key:
                if row.measured:
                    return row
                inferred = inferred or row
        return inferred

    def known(self) -> set[str]:
        """Config keys with a row, or claimed by another worker: not to be proposed again."""
        return {r.config_key for r in self.rows} | self.skipped

    def has_fidelity(self, fidelity: Fidelity) -> bool:
        return any(r.fidelity == fidelity for r in self.rows)

    @property
    def capacity(self) -> int:
        """Device memory per rank: the configured budget, else the largest capacity a probe reported (0: unknown)."""
        return self.device_memory or max((int(r.capacity or 0) for r in self.rows), default=0)

    def best(self) -> Candidate | None:
        return best_stable(self.rows)

    def estimate(self, knobs: Knobs) -> int | None:
        """The calibrated memory estimate of ``knobs`` in bytes, or None without an estimator or a traced point."""
        if self.estimator is None:
            return None
        try:
            return int(self.estimator.predict(knobs).calibrated)
        except TunerError:  # e.g. no traced point for this checkpointing/precision: no estimate, probe it
            return None

    def infer(self, knobs: Knobs) -> Inference:
        """ "oom" when the frontier says the config must run out of memory, or the estimate puts it far over the
        capacity (above ``estimate_margin`` x capacity); else None, with the estimate for the record."""
        if self.frontier.infer(knobs) == "oom":
            measured = dict(self.frontier.evidence(knobs)[0][0])  # the measured OOM the cause names
            return Inference("oom", self.frontier.explain(knobs), ruled_out_by=RuledOutBy(measured=measured))
        estimate = self.estimate(knobs)
        capacity = self.capacity
        if estimate is not None and capacity and estimate > self.estimate_margin * capacity:
            cause = f"inferred-oom: estimated peak {estimate / 2**20:.0f} MiB > {self.estimate_margin:g} x capacity"
            return Inference("oom", cause, estimate, RuledOutBy(estimate_bytes=estimate, margin=self.estimate_margin))
        return Inference(None, None, estimate)
