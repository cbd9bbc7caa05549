"""How long probes take: the probe schedule per fidelity and the time model that keeps every probe in the budget.

Pure functions over probe rows (the shape of tuner_probes rows), so a replay on recorded tables uses the same model.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

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


def walls(rows: Rows, fidelity: str | None = None) -> list[float]:
    """Wall seconds of the measured probes (all fidelities, or one)."""
    return [
        float(r.probe_seconds)
        for r in rows
        if r.probe_seconds and r.measured and (fidelity is None or r.fidelity == fidelity)
    ]


def expected_seconds(rows: Rows, schedule: Schedule, fidelity: str) -> float:
    """Expected wall seconds of the next probe at ``fidelity``: the median so far (confirm: scaled by its steps)."""
    found = walls(rows)
    if not found:
        return schedule.first_probe_s
    short = statistics.median(found)
    if fidelity != "confirm":
        return short
    confirmed = walls(rows, Fidelity.CONFIRM)
    if confirmed:
        return statistics.median(confirmed)
    setups = [float(r.setup_s) for r in rows if r.setup_s]
    setup = statistics.median(setups) if setups else short / 2
    ratio = sum(schedule.confirm) / sum(schedule.short)
    return setup + max(short - setup, 0.0) * ratio


def budgeted_seconds(rows: Rows, schedule: Schedule, fidelity: str, seconds_left: float) -> float:
    """Expected seconds of the next probe, as the budget sees it. Before any probe was measured the model only has a
    guess (``first_probe_s``): it does not keep the first probe from starting, which then runs with the budget left as
    its timeout (a tiny model's whole search may take less than the guess)."""
    expected = expected_seconds(rows, schedule, fidelity)
    return expected if walls(rows) else min(expected, max(seconds_left, MIN_TIMEOUT_S))


def scaled_seconds(rows: Rows, schedule: Schedule, knobs: Knobs | None, fidelity: str) -> float:
    """The slowest measured seconds per (sample x token x step), scaled to ``knobs`` (bigger configs run longer)."""
    if knobs is None:
        return 0.0
    worst, setups = 0.0, []
    for r in rows:
        if not r.probe_seconds or not r.measured or not r.config:
            continue
        cfg, k = r.config, r.knobs
        setup = float(r.setup_s or 0.0)
        setups.append(setup)
        work = k["micro_batch_size"] * k["max_length"] * (cfg["warmup_steps"] + cfg["measure_steps"])
        worst = max(worst, (float(r.probe_seconds) - setup) / max(work, 1))
    steps = sum(schedule.confirm if fidelity == "confirm" else schedule.short)
    return max(setups, default=0.0) + worst * knobs.micro_batch_size * knobs.max_length * steps


def timeout_for(
    rows: Rows, schedule: Schedule, fidelity: str, seconds_left: float | None, knobs: Knobs | None = None
) -> float:
    """factor x the longer of the longest probe so far and this config's size-scaled time, plus slack; never past
    ``seconds_left`` (the runner kills the probe at its timeout, so no probe outlives the budget)."""
    found = walls(rows)
    if found:
        longest = max(max(found), scaled_seconds(rows, schedule, knobs, fidelity))
        if fidelity == "confirm":
            longest = max(longest, expected_seconds(rows, schedule, "confirm"))
        timeout = schedule.timeout_factor * longest + schedule.timeout_slack_s
    else:
        timeout = schedule.max_timeout_s
    timeout = min(timeout, schedule.max_timeout_s)
    if seconds_left is not None:
        timeout = min(timeout, seconds_left)
    return max(timeout, MIN_TIMEOUT_S)
