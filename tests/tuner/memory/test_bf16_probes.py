"""bf16 as DeepSpeed runs it (issue 32): real DeepSpeed bf16 probes on the emulated device (which counts the real
bf16 tensors) against the uncalibrated estimate, per phase (train, eval forward, generate). Measured before the fix
on the same configs (tiny T5, micro 4, 64 -> 16, eval batch 8 + generate 16): ZeRO-1 train +14.7% (the trace ran
fp32 weights under autocast, whose fp32 residual stream the half module does not keep, and ZeRO-1's reduce bucket
was charged 4 bytes an element where DeepSpeed allocates it in bf16), ZeRO-2 + offload eval forward +35.2% (autocast,
and the encoder mask the fake trace built and the real run skips); the tiny Llama's ZeRO-0 train +8.5%."""

from __future__ import annotations

from pathlib import Path

import pytest

from trials.contract import JobSettings, Knobs, ModelSpec
from tuner.memory.estimator import Estimator, Evaluation, trace, trace_at
from tuner.probing.config import probe_config
from tuner.probing.runner import run_probe

T5 = ModelSpec(source="builtin:tiny-t5")
LLAMA = ModelSpec(source="builtin:tiny-llama")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "length", "labels", "stage", "offload"),
    [(T5, 64, 16, 1, False), (T5, 64, 16, 2, True), (LLAMA, 128, None, 0, False)],
    ids=["t5-zero1", "t5-zero2-offload", "llama-zero0"],
)
def test_a_deepspeed_bf16_probe_matches_the_estimate_per_phase(
    tmp_path: Path, model: ModelSpec, length: int, labels: int | None, stage: int, offload: bool
) -> None:
    knobs = Knobs(
        micro_batch_size=4,
        max_length=length,
        zero_stage=stage,
        offload_optimizer=offload,
        reduce_bucket_size=500_000,
        allgather_bucket_size=500_000,
        precision="bf16",
        eval_batch_size=8,
        generate=True,
    )
    job = JobSettings(max_target_length=labels, generation_max_length=16)
    cfg = probe_config(model=model, knobs=knobs, gradient_accumulation_steps=2, measure_steps=2, timeout_s=300, job=job)
    result = run_probe(cfg, tmp_path)
    assert result.status == "ok", result.cause
    measured = result.ranks[0].phases
    evaluation = Evaluation(eval_batch_size=8, generate=True, generation_max_length=16)
    tr = trace(model, [trace_at(knobs)], label_length=labels, evaluation=evaluation)
    assert all(p.cast_module for p in tr.points)
    phases = {p.phase: p.total for p in Estimator(tr, world_size=1, global_batch=8).breakdown(knobs).ranks[0].phases}
    train = max(phases["forward_backward"], phases["optimizer_step"])
    assert abs(train / measured["train"] - 1) < 0.01, (train, measured)
    assert abs(phases["eval_forward"] / measured["eval_forward"] - 1) < 0.01, (phases, measured)
    # generate: transformers' generate in the probe, the fixed-length decode in the trace (within 5%, as for fp32)
    assert abs(phases["generate"] / measured["generate"] - 1) < 0.05, (phases, measured)
