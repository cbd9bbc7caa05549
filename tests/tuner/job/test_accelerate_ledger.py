"""An accelerate config through the ledger (tuner.job.ledger.accelerate): keys accelerate refuses are refused as it
refuses them, what a probe cannot run is one line with the fix, dynamo_config is the compile the probe runs."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.errors import BaselineError
from tuner.interop.baseline import parse_baseline
from tuner.job.definition import resolve_job
from tuner.job.ledger.accelerate import read_accelerate

FSDP = {
    "distributed_type": "FSDP",
    "num_processes": 2,
    "mixed_precision": "bf16",
    "fsdp_config": {"fsdp_version": 2},
}
ARGS = {"per_device_train_batch_size": 2, "max_seq_length": 64}


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"parallelism_config": {"parallelism_config_tp_size": 2}}, "tensor / context parallelism is not probed yet"),
        ({"fp8_config": {"backend": "TE"}}, "FP8"),
        ({"use_cpu": True}, "trains on the CPU"),
        ({"num_proceses": 2}, "did you mean 'num_processes'"),
        ({"dynamo_config": {"dynamo_use_regional_compilation": True}}, "regional compilation"),
        ({"dynamo_config": {"dynamo_bakend": "INDUCTOR"}}, "did you mean 'dynamo_backend'"),
    ],
)
def test_refused_keys_are_one_line(extra: dict[str, Any], said: str) -> None:
    with pytest.raises(BaselineError, match="accelerate config") as err:
        read_accelerate({**FSDP, **extra})
    assert said in str(err.value) and "\n" not in str(err.value)


def test_dynamo_config_is_the_compile_the_probe_runs() -> None:
    dynamo = {"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune", "dynamo_use_fullgraph": False}
    assert read_accelerate({**FSDP, "dynamo_config": dynamo}).compile == {
        "backend": "inductor",
        "mode": "max-autotune",
        "fullgraph": False,
    }
    assert read_accelerate({**FSDP, "dynamo_config": {"dynamo_backend": "NO"}}).compile is None
    assert read_accelerate({**FSDP, "dynamo_backend": "EAGER"}).compile == {"backend": "eager"}  # the older spelling
    base = parse_baseline(None, ARGS, accelerate={**FSDP, "dynamo_config": {"dynamo_backend": "INDUCTOR"}})
    job = resolve_job(builtin=False, baseline_knobs=base.knobs, hf_args=base.hf_args, compile=base.compile)
    assert job.settings().compile == {"backend": "inductor"} and "accelerate config: dynamo_config" in job.describe()


def test_nodes_and_hsdp_are_run() -> None:
    hsdp = {"parallelism_config_dp_replicate_size": 2, "parallelism_config_dp_shard_size": 2}
    held = read_accelerate({**FSDP, "num_machines": 2, "parallelism_config": hsdp})
    assert "accelerate config num_machines" not in held.kept and "accelerate config parallelism_config" not in held.kept


def test_launcher_keys_are_kept_and_named() -> None:
    held = read_accelerate({**FSDP, "main_process_port": 29500, "machine_rank": 0})
    assert {"accelerate config main_process_port", "accelerate config machine_rank"} <= set(held.kept)
