"""How long probes take: the probe schedule per fidelity, and the time model that keeps every probe in the budget.

``TimeModel`` reads the probe rows the search has seen (through the evidence: tuner.search.evidence) each time it is
asked, so a replay on recorded tables uses the same model. Pure: no clock, no Optuna, no storage.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from trials.contract import Knobs
from tuner.records import Fidelity, ProbeRow

Rows = Sequence[ProbeRow]


MIN_TIMEOUT_S = 1.0  # no probe runs with a shorter timeout (so none starts with less budget left)


@dataclass(frozen=True)
class Schedule:
    """Probe lengths per fidelity and the time model that keeps every probe inside the budget."""

    short: tuple[int, int] = (2, 4)  # (warm-up micro-steps, measured micro-steps)
    confirm: tuple[int, int] = (2, 12)
    finalists: int = 2  # stable configs re-probed at the confirm fidelity
    max_finalists: int = 3  # more, while a config's throughput cannot be told apart from the best confirmed one's
    first_probe_s: float = 30.0  # expected seconds of a probe before any was measured
    timeout_factor: float = 3.0  # a probe's timeout: factor x the longest probe seen so far + slack
    timeout_slack_s: float = 30.0  # (probe times vary a lot on shared machines; a killed probe is wasted time)
    max_timeout_s: float = 1800.0
    estimate_margin: float = 1.5  # skip configs predicted above margin x capacity
    stuck_asks: int = 8  # consecutive duplicate/inferred proposals before picking an unknown config directly
    guide: bool = True  # after the opening, probe the config of highest constrained EI (tuner.search.guide), not TPE's
    min_expected_gain: float = 0.001  # the guide stops exploring when no config is expected to gain more (log units)
    seed_bisection: bool = True  # open with a micro-batch bisection at the plainest config (proposers.opening)


class HasRows(Protocol):
    """Where the time model reads the rows (tuner.search.evidence.Evidence): they are replaced on every sync."""

    @property
    def rows(self) -> Rows: ...


class TimeModel:
    """Expected seconds and timeouts of the next probe, from the probe rows so far and the schedule."""

    def __init__(self, schedule: Schedule, source: HasRows) -> None:
        self.schedule, self.source = schedule, source

    def walls(self, fidelity: str | None = None) -> list[float]:
        """Wall seconds of the measured probes (all fidelities, or one)."""
        return [
            float(r.probe_seconds)
            for r in self.source.rows
            if r.probe_seconds and r.measured and (fidelity is None or r.fidelity == fidelity)
        ]

    def expected(self, fidelity: str) -> float:
        """Expected wall seconds of the next probe at ``fidelity``: the median so far (confirm: scaled by its steps)."""
        found = self.walls()
        if not found:
            return self.schedule.first_probe_s
        short = statistics.median(found)
        if fidelity != "confirm":
            return short
        confirmed = self.walls(Fidelity.CONFIRM)
        if confirmed:
            return statistics.median(confirmed)
        setups = [float(r.setup_s) for r in self.source.rows if r.setup_s]
        setup = statistics.median(setups) if setups else short / 2
        ratio = sum(self.schedule.confirm) / sum(self.schedule.short)
        return setup + max(short - setup, 0.0) * ratio

    def budgeted(self, fidelity: str, seconds_left: float) -> float:
        """Expected seconds of the next probe, as the budget sees it. Before any probe was measured the model only has
        a guess (``first_probe_s``): it does not keep the first probe from starting, which then runs with the budget
        left as its timeout (a tiny model's whole search may take less than the guess)."""
        expected = self.expected(fidelity)
        return expected if self.walls() else min(expected, max(seconds_left, MIN_TIMEOUT_S))

    def fits(self, fidelity: str, seconds_left: float | None) -> bool:
        """Whether a probe at ``fidelity`` is expected to finish in ``seconds_left`` (None: no budget)."""
        return seconds_left is None or self.budgeted(fidelity, seconds_left) <= seconds_left

    def short_fits_beside(self, confirms: int, seconds_left: float) -> bool:
        """Whether a short probe fits in ``seconds_left`` beside the time kept for ``confirms`` confirm probes, but only
        for as many as can still fit: when not even one confirm fits, the time goes to short probes instead of being
        kept for nothing."""
        confirm_s = self.expected(Fidelity.CONFIRM)
        reserve = min(confirms, int(seconds_left // confirm_s)) * confirm_s if confirm_s > 0 else 0.0
        return seconds_left - reserve >= self.budgeted(Fidelity.SHORT, seconds_left)

    def scaled(self, knobs: Knobs | None, fidelity: str) -> float:
        """The slowest measured seconds per (sample x token x step), scaled to ``knobs`` (bigger configs run longer)."""
        if knobs is None:
            return 0.0
        worst, setups = 0.0, []
        for r in self.source.rows:
            if not r.probe_seconds or not r.measured or not r.config:
                continue
            cfg, k = r.config, r.knobs
            setup = float(r.setup_s or 0.0)
            setups.append(setup)
            work = k["micro_batch_size"] * k["max_length"] * (cfg["warmup_steps"] + cfg["measure_steps"])
            worst = max(worst, (float(r.probe_seconds) - setup) / max(work, 1))
        steps = sum(self.schedule.confirm if fidelity == "confirm" else self.schedule.short)
        return max(setups, default=0.0) + worst * knobs.micro_batch_size * knobs.max_length * steps

    def timeout(self, fidelity: str, seconds_left: float | None, knobs: Knobs | None = None) -> float:
        """factor x the longer of the longest probe so far and this config's size-scaled time, plus slack; never past
        ``seconds_left`` (the runner kills the probe at its timeout, so no probe outlives the budget)."""
        found = self.walls()
        if found:
            longest = max(max(found), self.scaled(knobs, fidelity))
            if fidelity == "confirm":
                longest = max(longest, self.expected("confirm"))
            timeout = self.schedule.timeout_factor * longest + self.schedule.timeout_slack_s
        else:
            timeout = self.schedule.max_timeout_s
        timeout = min(timeout, self.schedule.max_timeout_s)
        if seconds_left is not None:
            timeout = min(timeout, seconds_left)
        return max(timeout, MIN_TIMEOUT_S)
