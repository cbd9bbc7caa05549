"""A DeepSpeed JSON through the ledger (tuner.job.ledger.deepspeed): what a probe cannot run is one line, switched-off
sections pass, host sections are kept and named."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.errors import BaselineError
from tuner.interop.baseline import parse_baseline
from tuner.job.ledger.deepspeed import read_deepspeed

DS = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"tensor_parallel": {"autotp_size": 2}}, "tensor parallelism"),
        ({"elasticity": {"enabled": True, "max_train_batch_size": 64}}, "changes the batch size"),
        ({"curriculum_learning": {"enabled": True}}, "changes the sequence lengths"),
        ({"compression_training": {"weight_quantization": {}}}, "compression training"),
        ({"amp": {"enabled": True}}, "apex AMP"),
    ],
)
def test_sections_a_probe_cannot_run_are_refused_in_one_line(extra: dict[str, Any], said: str) -> None:
    with pytest.raises(BaselineError, match=f"DeepSpeed {next(iter(extra))}") as err:
        parse_baseline({**DS, **extra}, None, max_length=8)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_switched_off_sections_and_host_sections_pass() -> None:
    off = {"elasticity": {"enabled": False}, "tensor_parallel": {"autotp_size": 1}, "pipeline": {"stages": 1}}
    host = {"wandb": {"enabled": True, "project": "x"}, "flops_profiler": {"enabled": True}}
    kept = read_deepspeed({**DS, **off, **host})
    assert set(kept) == {
        "deepspeed wandb",
        "deepspeed flops_profiler",
        "deepspeed pipeline",
        "deepspeed tensor_parallel",
    }
    base = parse_baseline({**DS, **off, **host}, None, max_length=8)
    assert {"deepspeed wandb", "deepspeed flops_profiler"} <= set(base.kept)
