"""FSDP2's estimate (issue 31): each config's own probe traced in one process on a fake process group of its world
size (trials.trace_fsdp) against real FSDP2 probes on 2 gloo ranks, per phase; the fit between traced shapes; the
refusal of a model FSDP2 cannot shard; `tuner estimate --engine fsdp2` part by part.

Before the trace ran FSDP2 itself the estimator read an FSDP2 config as DeepSpeed ZeRO-0 (16 bytes a parameter, no
sharding): tiny-llama on 2 ranks, micro 2 x 64, read 4.5 MiB where the probe holds 2.9 MiB."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from trials.contract import JobSettings, Knobs, ModelSpec
from tuner.errors import ConfigError
from tuner.memory.breakdown import GATHERED, ZERO_BUFFERS, Part, PhaseEstimate, columns
from tuner.memory.estimator import Estimator, Evaluation, FsdpPoint, Trace, fsdp_at, trace
from tuner.memory.fsdp import fit_constant_and_curve
from tuner.probing.config import probe_config
from tuner.probing.runner import ProbeRunner
from tuner.settings import load_settings

LLAMA = ModelSpec(source="builtin:tiny-llama")
EVAL = Evaluation(eval_batch_size=4, generate=True, generation_max_length=8)
GLOBAL = 8  # micro 2 on 2 ranks: 2 micro-steps a step (no_sync keeps the unsharded grads between them)


def fsdp(**knobs: object) -> Knobs:
    base = {"micro_batch_size": 2, "max_length": 64, "engine": "fsdp2", "eval_batch_size": 4, "generate": True}
    return Knobs(**{**base, **knobs})


CONFIGS = [
    fsdp(),
    fsdp(reshard_after_forward=False),
    fsdp(offload_params=True, gradient_checkpointing=True, micro_batch_size=4),
    fsdp(precision="bf16", reshard_after_forward=False),
]


@pytest.mark.slow
def test_the_trace_of_each_fsdp2_config_reads_what_its_probe_measures_per_phase() -> None:
    est = Estimator(
        trace(LLAMA, [], evaluation=EVAL, fsdp_points=[fsdp_at(k, 2, k.micro_batch_size == 2) for k in CONFIGS]),
        world_size=2,
        global_batch=GLOBAL,
    )
    runner = ProbeRunner(load_settings())
    job = JobSettings(generation_max_length=8)
    for k in CONFIGS:
        accum = GLOBAL // (2 * k.micro_batch_size)
        result = runner(probe_config(knobs=k, model=LLAMA, world_size=2, gradient_accumulation_steps=accum, job=job))
        assert result.status == "ok" and result.sharded is True, result.cause  # sharded for real, not DDP
        measured = result.phase_peaks
        phases = {p.phase: p.total for p in est.breakdown(k).worst.phases}
        train = max(phases["forward_backward"], phases["optimizer_step"])
        assert abs(train / measured["train"] - 1) < 0.001, (k.engine_label, train, measured)
        assert abs(phases["eval_forward"] / measured["eval_forward"] - 1) < 0.01, (k.engine_label, phases, measured)
        # generate: transformers' generate in the probe, the fixed-length decode in the trace (as for DeepSpeed)
        assert abs(phases["generate"] / measured["generate"] - 1) < 0.03, (k.engine_label, phases, measured)
    kept, resharded = est.breakdown(CONFIGS[1]).worst, est.breakdown(CONFIGS[0]).worst
    fb = "forward_backward"
    assert kept.phase(fb).part(GATHERED) > resharded.phase(fb).part(GATHERED) > 0  # blocks kept to the backward
    offload = est.breakdown(CONFIGS[2]).worst.phase(fb)
    assert offload.part("parameters") == 0 and offload.part("optimizer states") < 1024  # on the host


def test_a_model_fsdp2_cannot_shard_is_its_estimate_s_one_line_reason() -> None:
    est = Estimator(trace(ModelSpec(source="builtin:tiny-t5"), [], fsdp_points=[fsdp_at(fsdp(), 1, False)]), 1, 2)
    with pytest.raises(ConfigError, match="shared by modules accelerate puts in different FSDP groups"):
        est.predict(fsdp())


def _point(micro: int, length: int, rest: int, gathered: int = 1000, **fields: object) -> FsdpPoint:
    return FsdpPoint(
        micro_batch_size=micro,
        max_length=length,
        world_size=2,
        accumulates=True,
        states_bytes=10_000,
        param_shard_bytes=4_000,
        forward_backward_bytes=rest + gathered,
        gathered_bytes=gathered,
        step_bytes=500,
        **fields,
    )


def test_another_shape_is_fitted_with_a_constant_beside_the_per_sample_curve() -> None:
    c, a, b = 5_000.0, 30.0, 0.25
    points = [(m, s, c + m * (a * s + b * s * s)) for m in (1, 8) for s in (64, 256)]
    got = fit_constant_and_curve(points)
    assert got == pytest.approx((c, a, b), rel=1e-6)
    traced = Trace(
        param_count=1,
        param_bytes=4,
        largest_param=1,
        fsdp_points=[_point(m, s, int(v)) for m, s, v in points],
    )
    est = Estimator(traced, world_size=2, global_batch=None)
    k = Knobs(micro_batch_size=4, max_length=128, engine="fsdp2")
    phase = est.breakdown(k).worst.phase("forward_backward")
    assert phase.total == pytest.approx(10_000 + 1_000 + c + 4 * (a * 128 + b * 128 * 128), abs=2)
    assert est.states(k).total == 10_000 and phase.part("parameters") == 4_000
    # another world size, or a config that does not accumulate, was not traced: no number, the reason instead
    with pytest.raises(ConfigError, match=r"no FSDP2 point .* on 4 rank"):
        Estimator(traced, world_size=4).predict(k)
    assert columns(est.breakdown(k).worst.phases)[3] == GATHERED
    deepspeed = PhaseEstimate("forward_backward", (Part(ZERO_BUFFERS, 1),))
    assert ZERO_BUFFERS in columns([deepspeed]) and GATHERED not in columns([deepspeed])


@pytest.mark.slow
def test_tuner_estimate_engine_fsdp2_prints_its_parts_and_how_it_was_traced() -> None:
    from tuner.cli.app import _register, app

    _register()
    args = ["estimate", "--model", "builtin:tiny-llama", "--world-size", "2", "--engine", "fsdp2"]
    args += ["--micro-batch-size", "2", "--max-length", "64", "--global-batch", "8", "--no-reshard-after-forward"]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    out = " ".join(done.output.split())
    assert "config from options: micro 2, FSDP2 kept gathered" in out
    assert "gathered parameters" in out and "ZeRO buffers" not in out
    assert "precision traced: fp32 (the job trains in fp32; engine fsdp2)" in out
    assert "peak: train forward + backward, 3.7 MiB" in out  # its 2-rank probe measures the same bytes
