"""The probe's schedule (issue 30 §4): the timed window stops when its cycles agree within what the search can tell
apart (the spread reported), measures longer on a noisy host, runs drawn batches once; every probe says where its
time went after setup (run_phases) and in the engine's setup (engine.ops, engine.initialize)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trials.contract import Knobs
from trials.measure import TimedWindow, step_stats
from tuner.probing.config import probe_config
from tuner.probing.runner import run_probe


def test_quiet_cycles_stop_at_the_minimum() -> None:
    window = TimedWindow(min_cycles=2, max_cycles=6, tolerance=0.05)
    assert window.record(1.00) is False
    assert window.record(1.02) is True
    assert window.spread == pytest.approx(0.02 / 1.01)


def test_noisy_cycles_measure_longer_until_they_agree_or_the_most() -> None:
    window = TimedWindow(min_cycles=2, max_cycles=5, tolerance=0.05)
    assert [window.record(t) for t in (1.0, 1.5, 1.2)] == [False, False, False]
    assert window.record(1.21) is True  # the last two agree: 0.8%
    capped = TimedWindow(min_cycles=2, max_cycles=4, tolerance=0.05)
    assert [capped.record(t) for t in (1.0, 2.0, 1.0, 2.0)] == [False, False, False, True]
    assert capped.spread == pytest.approx(1.0 / 1.5)  # said, not hidden


def test_the_minimum_is_never_cut_short() -> None:
    """The extension past the measured steps is what a deadline may cut; the measured steps themselves run (a probe
    asked for 10^7 steps runs until its timeout, as tests/tuner/probing/test_runner.py's timeout test needs)."""
    window = TimedWindow(min_cycles=3, max_cycles=6, tolerance=0.0)
    window.record(1.0)
    assert not window.past_minimum
    window.record(1.0)
    window.record(2.0)
    assert window.past_minimum


def test_drawn_batches_run_their_cycles_once() -> None:
    window = TimedWindow(min_cycles=3, max_cycles=3, tolerance=math.inf)
    assert [window.record(t) for t in (1.0, 3.0, 2.0)] == [False, False, True]


def test_step_stats_carry_the_windows_cycles_and_spread() -> None:
    window = TimedWindow(min_cycles=2, max_cycles=2, tolerance=0.0)
    window.record(2.0)
    window.record(2.2)
    stats = step_stats([0.5, 0.6], [1.5, 1.6], accum=2, window=window)
    assert stats.cycles == 2 and stats.spread == pytest.approx(0.2 / 2.1)
    assert step_stats([0.5], [1.5], accum=2).cycles == 0


@pytest.mark.slow
def test_a_probe_stops_when_its_cycles_agree_and_says_where_its_time_went(tmp_path: Path) -> None:
    knobs = Knobs(micro_batch_size=2, max_length=16, zero_stage=1)
    strict = probe_config(knobs=knobs, gradient_accumulation_steps=2, timing_tolerance=0.0, timeout_s=240)
    result = run_probe(strict, tmp_path / "strict")
    assert result.status == "ok", result.cause
    assert result.steps is not None and result.steps.cycles == 4  # never agreed within 0: the most, 2 x 4 / 2
    assert result.steps.spread is not None and result.steps.spread > 0
    assert {"memory_window", "timed_build", "timed"} <= set(result.run_phases)
    assert {"engine", "engine.ops", "engine.initialize"} <= set(result.setup_phases)
    assert result.setup_phases["engine.initialize"] <= result.setup_phases["engine"]
    loose = run_probe(strict.model_copy(update={"timing_tolerance": 10.0}), tmp_path / "loose")
    assert loose.status == "ok" and loose.steps is not None and loose.steps.cycles == 2  # agreed at once


@pytest.mark.slow
def test_two_ranks_stop_their_timed_window_together(tmp_path: Path) -> None:
    """A rank stopping alone would leave the other in a collective until the timeout: the stop is agreed."""
    knobs = Knobs(micro_batch_size=1, max_length=16, zero_stage=2)
    cfg = probe_config(knobs=knobs, world_size=2, gradient_accumulation_steps=2, timing_tolerance=0.2, timeout_s=240)
    result = run_probe(cfg, tmp_path / "two")
    assert result.status == "ok", result.cause
    assert result.steps is not None and 2 <= result.steps.cycles <= 4
