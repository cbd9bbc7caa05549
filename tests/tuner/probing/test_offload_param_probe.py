"""ZeRO-3 parameter offload (the offload_param knob) probed on 2 gloo ranks: DeepSpeed runs the JSON the export writes
(zero_optimization.offload_param.device cpu), the probe ends ok, and the parameter partitions leave the emulated
device: the peak drops by one rank's fp32 partition of the model, with the optimizer on the device or offloaded too
(DeepSpeedCPUAdam, the cpu_adam op the runner builds); the estimate of the offloaded config is its measured peak."""

from __future__ import annotations

from pathlib import Path

import pytest

from trials.contract import Knobs, ModelSpec
from tuner.memory.estimator import Estimator, trace, trace_at
from tuner.probing.config import probe_config
from tuner.probing.runner import run_probe

LLAMA = ModelSpec(source="builtin:tiny-llama")
PARAMS = 124_000  # builtin:tiny-llama: about this many parameters (fp32 here: 4 bytes each)


def _knobs(**offload: bool) -> Knobs:
    return Knobs(micro_batch_size=2, max_length=32, zero_stage=3, reduce_bucket_size=50_000, **offload)


def _peak(tmp: Path, name: str, **offload: bool) -> int:
    knobs = _knobs(**offload)
    cfg = probe_config(
        model=LLAMA, knobs=knobs, world_size=2, gradient_accumulation_steps=1, measure_steps=2, timeout_s=300
    )
    assert cfg.deepspeed is not None
    device = "cpu" if offload.get("offload_param") else None
    assert cfg.deepspeed["zero_optimization"].get("offload_param", {}).get("device") == device
    result = run_probe(cfg, tmp / name)
    assert result.status == "ok", result.cause
    assert sorted(r.rank for r in result.ranks) == [0, 1]
    assert result.peak_allocated is not None
    return result.peak_allocated


@pytest.mark.slow
def test_zero3_parameter_offload_runs_on_two_ranks_and_takes_the_partitions_off_the_device(tmp_path: Path) -> None:
    resident = _peak(tmp_path, "resident")
    offloaded = _peak(tmp_path, "param", offload_param=True)
    partition = 4 * PARAMS / 2  # one rank's fp32 partition of the parameters
    assert 0.9 * partition < resident - offloaded < 1.1 * partition, (resident, offloaded)
    knobs = _knobs(offload_param=True)  # the estimate puts the same partitions on the host
    predicted = Estimator(trace(LLAMA, [trace_at(knobs)]), world_size=2, global_batch=4).predict(knobs).raw
    assert abs(predicted / offloaded - 1) < 0.05, (predicted, offloaded)
    both = _peak(tmp_path, "both", offload_param=True, offload_optimizer=True)
    assert both < offloaded  # the optimizer's partition and state left too
