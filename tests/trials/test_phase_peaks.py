"""Per-phase peaks of a probe (issue 22 §2): the train step, the eval forward and the generate each get their peak,
per rank, and the probe's overall peak stays the most of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trials.contract import MEMORY_PHASES, Knobs
from trials.measure import PhasePeaks
from trials.memory import LiveTensorTracker
from tuner.probing.config import probe_config
from tuner.probing.runner import run_probe


def test_phase_peaks_split_the_window_and_keep_its_overall_peak() -> None:
    tracker = LiveTensorTracker()
    peaks = PhasePeaks.of(lambda: tracker, torch.device("cpu"))
    with tracker:
        big = torch.ones(1000)  # 4,000 bytes
        del big
        peaks.end("train")
        small = torch.ones(100)  # 400 bytes
        peaks.end("eval_forward")
        del small
    assert peaks.peaks == {"train": 4000, "eval_forward": 400}
    assert peaks.overall() == (4000, 4000)  # what the window saw, not the last phase's


@pytest.mark.slow
def test_a_probe_stores_the_peak_of_each_phase(tmp_path: Path) -> None:
    knobs = Knobs(micro_batch_size=2, max_length=32, engine="torch", eval_batch_size=8, generate=True)
    result = run_probe(probe_config(knobs=knobs, device_memory=64 << 20, timeout_s=240), tmp_path / "eval")
    assert result.status == "ok", result.cause
    phases = result.phase_peaks
    assert list(phases) == list(MEMORY_PHASES) and all(v > 0 for v in phases.values())
    assert result.peak_allocated is not None and max(phases.values()) <= result.peak_allocated
    assert all(r.phases for r in result.ranks)  # per rank
    plain = run_probe(probe_config(knobs=knobs.model_copy(update={"eval_batch_size": None, "generate": False})))
    assert plain.status == "ok", plain.cause
    assert list(plain.phase_peaks) == ["train"]
