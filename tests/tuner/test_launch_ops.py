"""Which DeepSpeed ops a probe needs before its clock starts (pure)."""

from __future__ import annotations

from pathlib import Path

from trials.contract import Knobs, ProbeConfig
from tuner.launch_ops import missing_ops, needed_ops


def _cfg(**knobs: object) -> ProbeConfig:
    return ProbeConfig(knobs=Knobs(micro_batch_size=1, max_length=8, **knobs))  # type: ignore[arg-type]


def test_needed_ops() -> None:
    assert needed_ops(_cfg(engine="torch"), gpu_host=False) == []
    assert needed_ops(_cfg(zero_stage=2), gpu_host=False) == ["shm_comm"]
    assert needed_ops(_cfg(zero_stage=2), gpu_host=True) == []
    assert needed_ops(_cfg(zero_stage=2, offload_optimizer=True), gpu_host=True) == ["cpu_adam"]
    assert needed_ops(_cfg(zero_stage=1, offload_optimizer=True), gpu_host=False) == ["cpu_adam", "shm_comm"]


def test_missing_ops_looks_for_the_built_library(tmp_path: Path) -> None:
    assert missing_ops(["cpu_adam", "shm_comm"], tmp_path) == ["cpu_adam", "shm_comm"]
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "lock").write_text("")  # a build in progress is not a built op
    assert missing_ops(["cpu_adam"], tmp_path) == ["cpu_adam"]
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    assert missing_ops(["cpu_adam", "shm_comm"], tmp_path) == ["shm_comm"]
