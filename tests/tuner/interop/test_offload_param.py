"""ZeRO-3's parameter offload as a knob (``offload_param``): only with ZeRO-3, sampled only at stage 3, read from a
baseline's DeepSpeed JSON (and accelerate's plugin ``offload_param_device``) as that knob, written back by the
exports, charged to host memory by the estimate, ordered by the frontier. The probe that runs it on 2 gloo ranks:
tests/tuner/probing/test_offload_param_probe.py."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from trials.contract import Knobs
from tuner.interop.baseline import parse_baseline
from tuner.interop.export import render
from tuner.interop.export.deepspeed import to_deepspeed
from tuner.job.space import Space, space_from_dict
from tuner.memory.frontier import needs_at_least, normalize
from tuner.memory.states import model_state_bytes

ZERO3: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": False}},
    "bf16": {"enabled": True},
}


def knobs(**extra: Any) -> Knobs:
    return Knobs(micro_batch_size=4, max_length=64, zero_stage=3, precision="bf16", **extra)


def test_the_knob_is_zero3s_and_a_dump_holds_it_only_when_on() -> None:
    assert "offload_param" not in knobs().model_dump()
    assert knobs(offload_param=True).model_dump()["offload_param"] is True
    assert knobs(offload_param=True).engine_label == "ZeRO-3, offload params"
    for bad in ({"zero_stage": 2}, {"engine": "torch", "zero_stage": 0}):
        with pytest.raises(ValidationError, match="offload_param is ZeRO-3's parameter offload"):
            Knobs(micro_batch_size=4, max_length=64, offload_param=True, **bad)


def test_the_space_samples_it_at_stage_3_only() -> None:
    base = {"micro_batch_size": [4], "max_length": [64], "zero_stage": [2, 3], "offload_param": [False, True]}
    space = space_from_dict(base)
    configs = list(space.configs())
    assert len(configs) == space.count() == 3  # stage 2, stage 3 with and without
    assert {(k.zero_stage, k.offload_param) for k in configs} == {(2, False), (3, False), (3, True)}
    assert "offload_param" not in Space.model_validate({**base, "offload_param": [False]}).model_dump()


def test_a_zero3_baseline_with_parameter_offload_is_that_knob() -> None:
    base = parse_baseline(ZERO3, None, max_length=64)
    assert base.knobs["offload_param"] is True and base.knobs["zero_stage"] == 3
    legacy = copy.deepcopy(ZERO3)
    legacy["zero_optimization"] = {"stage": 3, "cpu_offload_param": True}
    assert parse_baseline(legacy, None, max_length=64).knobs["offload_param"] is True
    stage2 = copy.deepcopy(ZERO3)
    stage2["zero_optimization"]["stage"] = 2  # DeepSpeed reads offload_param under ZeRO-3 only
    assert "offload_param" not in parse_baseline(stage2, None, max_length=64).knobs


def test_accelerates_plugin_with_parameter_offload_is_that_knob() -> None:
    accelerate = {
        "distributed_type": "DEEPSPEED",
        "num_processes": 2,
        "mixed_precision": "bf16",
        "deepspeed_config": {"zero_stage": 3, "offload_param_device": "cpu", "zero3_init_flag": True},
    }
    base = parse_baseline(None, {"per_device_train_batch_size": 2, "bf16": True}, accelerate=accelerate, max_length=64)
    assert base.knobs["offload_param"] is True and base.knobs["offload_optimizer"] is False


def test_the_exports_write_it_back_with_their_own_options() -> None:
    on = to_deepspeed(
        knobs(offload_param=True).model_dump(), world_size=2, gradient_accumulation_steps=2, baseline=ZERO3
    )
    assert on["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": False}  # theirs kept
    fresh = to_deepspeed(knobs(offload_param=True).model_dump(), world_size=2, gradient_accumulation_steps=2)
    assert fresh["zero_optimization"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    off = to_deepspeed(knobs().model_dump(), world_size=2, gradient_accumulation_steps=2, baseline=ZERO3)
    assert off["zero_optimization"]["offload_param"] == {"device": "none"}
    assert (
        "offload_param"
        not in to_deepspeed(knobs().model_dump(), world_size=2, gradient_accumulation_steps=2)["zero_optimization"]
    )
    stage2 = Knobs(micro_batch_size=4, max_length=64, zero_stage=2).model_dump()
    assert (
        "offload_param"
        not in to_deepspeed(stage2, world_size=2, gradient_accumulation_steps=2, baseline=ZERO3)["zero_optimization"]
    )
    env = render("env", knobs(offload_param=True).model_dump(), world_size=2, gradient_accumulation_steps=2)
    assert "OFFLOAD_PARAM=1" in env


def test_the_estimate_puts_the_parameter_partitions_on_the_host() -> None:
    on = model_state_bytes(knobs(offload_param=True), 1_000_000, 2)
    off = model_state_bytes(knobs(), 1_000_000, 2)
    assert on.params == 0 and off.params == 1_000_000  # bf16: 2 bytes x 1M / 2 ranks
    assert (on.grads, on.optimizer, on.buffers) == (off.grads, off.optimizer, off.buffers)


def test_a_fit_with_parameter_offload_says_nothing_of_the_config_without() -> None:
    on, off = normalize(knobs(offload_param=True)), normalize(knobs())
    assert needs_at_least(off, on) and not needs_at_least(on, off)


def test_tuner_estimate_takes_it_and_refuses_it_below_stage_3(tmp_path: Path) -> None:
    tuner = str(Path(sys.executable).with_name("tuner"))
    env = {**os.environ, "COLUMNS": "200", "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    common = ["estimate", "--model", "builtin:tiny-llama", "--world-size", "2", "--max-length", "32"]
    baseline = tmp_path / "ds.json"
    baseline.write_text(json.dumps({**ZERO3, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([tuner, *common, *args], capture_output=True, text=True, env=env, timeout=300)

    done = run("--baseline", str(baseline))
    assert done.returncode == 0, done.stderr
    assert "parameters: host memory (offload_param)" in done.stdout
    lower = run("--baseline", str(baseline), "--zero-stage", "2")  # their offload is ZeRO-3's: not at stage 2
    assert lower.returncode == 0 and "offload_param" not in lower.stdout, lower.stderr
    refused = run("--micro-batch-size", "2", "--zero-stage", "2", "--offload-param")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "offload_param is ZeRO-3's parameter offload" in refused.stderr
