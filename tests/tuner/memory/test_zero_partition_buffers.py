"""The estimate against real DeepSpeed ZeRO-1 probes on the emulated device, with and without CPU offload: what
DeepSpeed holds per partition (tuner.memory.states.PhaseBuffers) and what the emulated device must not count (meta
tensors, the offload's host buffer). Before the fix the probe counted 4 bytes x params of meta tensors at ZeRO-1/2 and,
with offload, one partition of host buffer; the estimate lacked nothing then but missed by both. And a real ZeRO-3
probe of one micro-step per step: the backward's activation term ZeRO-2/3 need (the activations' peak with the grads
in flight)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trials.contract import Knobs, ModelSpec
from tuner.memory.estimator import Estimator, trace, trace_at
from tuner.probing.config import probe_config
from tuner.probing.runner import run_probe

TINY = ModelSpec(source="builtin:tiny-t5")


@pytest.mark.slow
@pytest.mark.parametrize("offload", [False, True])
def test_zero1_probe_peak_matches_the_estimate(tmp_path: Path, offload: bool) -> None:
    knobs = Knobs(
        micro_batch_size=2,
        max_length=32,
        zero_stage=1,
        offload_optimizer=offload,
        reduce_bucket_size=50_000,
        allgather_bucket_size=50_000,
    )
    predicted, measured = _estimated_and_measured(tmp_path, knobs, accumulation=2)
    # 4 x params = 1.05 MB of meta tensors alone was 3% of this peak: the fix has to bring it within 1%
    assert abs(predicted / measured - 1) < 0.01, (predicted, measured)


@pytest.mark.slow
def test_zero3_offload_one_micro_step_probe_matches_the_estimate(tmp_path: Path) -> None:
    """t5-mid-2rank-offload's worst config, shrunk to the tiny model on one rank: ZeRO-3 with CPU offload,
    checkpointing, one micro-step per step. The estimate took the fresh step's activation peak there, which the grads
    not yet built offset; ZeRO-3 (like ZeRO-2) holds no full grads, so its backward peaks at the activations' peak with
    the grads in flight (tuner.memory.estimator.Estimator._resident): 6% low before, within 3% now."""
    knobs = Knobs(
        micro_batch_size=16,
        max_length=32,
        zero_stage=3,
        offload_optimizer=True,
        gradient_checkpointing=True,
        reduce_bucket_size=50_000,
        allgather_bucket_size=50_000,
    )
    predicted, measured = _estimated_and_measured(tmp_path, knobs, accumulation=1)
    assert abs(predicted / measured - 1) < 0.03, (predicted, measured)


@pytest.mark.slow
def test_causal_lm_zero2_probe_matches_the_estimate(tmp_path: Path) -> None:
    """A tiny Llama under ZeRO-2 peaks in its loss (the log-softmax over the vocabulary and its backward) before the
    backward's first grad, when DeepSpeed has not yet allocated the 2M-element reduce bucket (7.6 MiB): counted on top
    of that peak, the estimate read up to 35% high on the recorded llama tables; and the fake trace's attention masks,
    which the real all-ones batch never builds, another 15% (tests/trials/test_estimate.py)."""
    knobs = Knobs(micro_batch_size=4, max_length=128, zero_stage=2, reduce_bucket_size=2_000_000)
    predicted, measured = _estimated_and_measured(
        tmp_path, knobs, accumulation=2, model=ModelSpec(source="builtin:tiny-llama")
    )
    assert abs(predicted / measured - 1) < 0.01, (predicted, measured)


def _estimated_and_measured(
    tmp_path: Path, knobs: Knobs, accumulation: int, model: ModelSpec = TINY
) -> tuple[int, int]:
    """The uncalibrated estimate of ``knobs`` on one rank and a real probe's peak (the emulated device)."""
    cfg = probe_config(
        model=model, knobs=knobs, gradient_accumulation_steps=accumulation, measure_steps=2, timeout_s=300
    )
    result = run_probe(cfg, tmp_path)
    assert result.status == "ok", result.cause
    assert result.peak_allocated is not None
    point = trace_at(knobs)
    est = Estimator(trace(model, [point]), world_size=1, global_batch=knobs.micro_batch_size * accumulation)
    return est.predict(knobs).raw, result.peak_allocated


@pytest.mark.slow
def test_zero2_eval_holds_no_reduce_bucket(tmp_path: Path) -> None:
    """ZeRO-2 frees its reduce buckets at the end of every backward: the eval forward and generate after the step hold
    none. With DeepSpeed's default 5e8-element bucket (1.9 GB fp32) the estimate charged it to both eval phases of a
    tiny Llama, whose eval forward peaks at 6.2 MiB. Generate runs transformers' own generate in the probe and the
    fixed-length decode in the trace: within 5% (3% low measured)."""
    from trials.contract import JobSettings
    from tuner.memory.estimator import Evaluation

    llama = ModelSpec(source="builtin:tiny-llama")
    knobs = Knobs(micro_batch_size=4, max_length=128, zero_stage=2, eval_batch_size=8, generate=True)
    cfg = probe_config(
        model=llama,
        knobs=knobs,
        gradient_accumulation_steps=2,
        measure_steps=2,
        timeout_s=300,
        job=JobSettings(generation_max_length=16),
    )
    result = run_probe(cfg, tmp_path)
    assert result.status == "ok", result.cause
    measured = result.ranks[0].phases
    evaluation = Evaluation(eval_batch_size=8, generate=True, generation_max_length=16)
    est = Estimator(trace(llama, [(4, 128, False, "fp32", False)], evaluation=evaluation), world_size=1, global_batch=8)
    phases = {p.phase: p for p in est.breakdown(knobs).ranks[0].phases}
    for name in ("eval_forward", "generate"):
        assert phases[name].part("ZeRO buffers") == 0
    assert abs(phases["eval_forward"].total / measured["eval_forward"] - 1) < 0.01
    assert abs(phases["generate"].total / measured["generate"] - 1) < 0.05
