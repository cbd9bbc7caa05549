"""A causal LM on padded data, measured: the user's collator pads a shorter sample, so the attention mask holds zeros
and transformers builds the [batch, 1, len, len] mask that an all-ones batch lets it skip. The probe of a job with
data pads its worst batch as their collator does, and the padded trace estimates what it measures."""

from __future__ import annotations

from pathlib import Path

import pytest

from trials.contract import BatchDims, DataBatches, Knobs, ModelSpec
from tuner.memory.estimator import Estimator, trace
from tuner.probing.config import probe_config
from tuner.probing.runner import run_probe

LLAMA = ModelSpec(source="builtin:tiny-llama")


@pytest.mark.slow
def test_a_padded_worst_batch_needs_its_mask_and_the_padded_trace_says_so(tmp_path: Path) -> None:
    knobs = Knobs(micro_batch_size=4, max_length=256)
    peaks = {}
    for padded in (False, True):
        at = BatchDims(input_length=256, padded=padded)
        batches = DataBatches(worst=at, timed=[[BatchDims(input_length=256, real_tokens=1000, padded=padded)]])
        cfg = probe_config(
            model=LLAMA, knobs=knobs, gradient_accumulation_steps=2, measure_steps=2, timeout_s=300, batches=batches
        )
        result = run_probe(cfg, tmp_path / str(padded))
        assert result.status == "ok", result.cause
        assert result.memory_shape is not None and result.memory_shape.padded == padded
        assert result.peak_allocated is not None
        peaks[padded] = result.peak_allocated
        point = (4, 256, False, "fp32", False)
        est = Estimator(trace(LLAMA, [point], padded=padded), world_size=1, global_batch=8)
        assert abs(est.predict(knobs).raw / result.peak_allocated - 1) < 0.01, (padded, result.peak_allocated)
    assert peaks[True] >= peaks[False] + 4 * 256 * 256  # at least the bool mask [4, 1, 256, 256]
