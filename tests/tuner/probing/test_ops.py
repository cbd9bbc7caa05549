"""Which DeepSpeed ops a probe needs before its clock starts, and the build's locking."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from trials.contract import Knobs, ProbeConfig
from tuner.probing import ops as launch_ops
from tuner.probing.config import probe_config
from tuner.probing.ops import ensure_ops, missing_ops, needed_ops


def _cfg(**knobs: object) -> ProbeConfig:
    return probe_config(knobs=Knobs(micro_batch_size=1, max_length=8, **knobs))  # type: ignore[arg-type]


def test_needed_ops() -> None:
    assert needed_ops(_cfg(engine="torch"), gpu_host=False) == []
    assert needed_ops(_cfg(zero_stage=2), gpu_host=False) == ["shm_comm"]
    assert needed_ops(_cfg(zero_stage=2), gpu_host=True) == []
    assert needed_ops(_cfg(zero_stage=2, offload_optimizer=True), gpu_host=True) == ["cpu_adam"]
    assert needed_ops(_cfg(zero_stage=1, offload_optimizer=True), gpu_host=False) == ["cpu_adam", "shm_comm"]


def test_the_users_adam_on_a_gpu_is_fused_adam_built_before_the_probe() -> None:
    """The team's DeepSpeed JSON has an AdamW section: on CUDA DeepSpeed JIT-builds FusedAdam inside trial 0, on every
    rank at once (issue 23, defect 5); offloaded it is DeepSpeedCPUAdam."""
    adamw = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    cfg = _cfg(zero_stage=2).model_copy(update={"deepspeed": adamw})
    assert needed_ops(cfg, gpu_host=True) == ["fused_adam"]
    assert needed_ops(cfg, gpu_host=False) == ["shm_comm"]  # the CPU accelerator runs torch's AdamW (torch_adam)
    offloaded = _cfg(zero_stage=2, offload_optimizer=True).model_copy(update={"deepspeed": adamw})
    assert needed_ops(offloaded, gpu_host=True) == ["cpu_adam"]
    assert launch_ops.prepare_ops(gpu_host=True) == ["cpu_adam", "fused_adam"]
    assert launch_ops.prepare_ops(gpu_host=False) == ["cpu_adam", "shm_comm"]


def test_a_host_with_visible_nvidia_gpus_is_not_asked_for_shm_comm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host kind comes from the visible devices, not from the launcher: on an NVIDIA host with the fork server in
    use, shm_comm (which DeepSpeed's CUDA accelerator never builds) is not demanded, so neither a probe nor `tuner
    prepare` waits on or fails over it (issue 23, defect 4). The device count is mocked (no GPU here)."""
    monkeypatch.setattr(launch_ops.gpus, "physical_gpus", lambda dev=None: 2)
    monkeypatch.setattr(launch_ops.subprocess, "Popen", _no_build)
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    assert ensure_ops(_cfg(zero_stage=1), env) == []
    assert ensure_ops(_cfg(zero_stage=1), {**env, "CUDA_VISIBLE_DEVICES": "1"}) == []
    assert launch_ops.gpus.has_visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) is False  # none visible: the CPU's


def _no_build(*args: object, **kwargs: object) -> None:
    raise AssertionError("no op should be built here")


def test_missing_ops_looks_for_the_built_library(tmp_path: Path) -> None:
    assert missing_ops(["cpu_adam", "shm_comm"], tmp_path) == ["cpu_adam", "shm_comm"]
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "lock").write_text("")  # a build in progress is not a built op
    assert missing_ops(["cpu_adam"], tmp_path) == ["cpu_adam"]
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    assert missing_ops(["cpu_adam", "shm_comm"], tmp_path) == ["shm_comm"]


def test_a_dead_builds_lock_is_cleared_before_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build killed from outside (kill -9 of a runner) leaves torch's FileBaton lock; every later load would wait on
    it until the probe's timeout. The next build, under tuner's flock, removes it first once it is older than any
    build. The compiler is replaced by a stand-in that records whether the lock was still there (the real build runs
    in tests/tuner/probing/test_runner.py)."""
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "lock").write_text("")
    old = time.time() - launch_ops.LOCK_STALE_S - 60
    os.utime(tmp_path / "cpu_adam" / "lock", (old, old))
    seen: dict[str, bool] = {}

    class Build:  # `python -m trials.ops OP`, one op per process
        def __init__(self, args: list[str], **_: object) -> None:
            self.op = args[-1]
            lib = launch_ops.OP_LIBS[self.op]
            seen[self.op] = (tmp_path / lib / "lock").exists()
            (tmp_path / lib).mkdir(exist_ok=True)
            (tmp_path / lib / f"{lib}.so").write_bytes(b"")
            self.pid = os.getpid()
            self.returncode = 0

        def communicate(self, timeout: float | None = None) -> tuple[str, None]:
            return (
                f'warning: on stdout too\n{{"op": "{self.op}", "outcome": "built", "reason": "", "seconds": 1}}\n',
                None,
            )

    monkeypatch.setattr(launch_ops.subprocess, "Popen", Build)
    monkeypatch.setattr(launch_ops.gpus, "physical_gpus", lambda dev=None: 0)
    built = ensure_ops(_cfg(zero_stage=1, offload_optimizer=True), {"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert seen == {"cpu_adam": False, "shm_comm": False}
    assert [(b.op, b.outcome) for b in built] == [("cpu_adam", "built"), ("shm_comm", "built")]


def test_a_live_builders_lock_is_waited_on_not_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed JIT-building in a Trainer that shares the op cache holds torch's lock outside tuner's flock; removing
    it made that builder fail at its release (FileNotFoundError on the lock: CI's offload probes were refused). The
    next build waits for it and finds the op built."""
    lib = tmp_path / "cpu_adam"
    lib.mkdir()
    (lib / "lock").write_text("")

    def other_builder() -> None:
        time.sleep(0.5)
        (lib / "cpu_adam.so").write_bytes(b"")
        (lib / "lock").unlink()

    monkeypatch.setattr(launch_ops, "stale", lambda op_dir: False)
    monkeypatch.setattr(launch_ops.subprocess, "Popen", _no_build)
    builder = threading.Thread(target=other_builder)
    builder.start()
    built = launch_ops.build_ops(["cpu_adam"], {"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    builder.join()
    assert [(b.op, b.outcome) for b in built] == [("cpu_adam", "cached")]


def test_a_library_ninja_would_rebuild_counts_as_missing(tmp_path: Path) -> None:
    """After a reinstall into the same venv path the op's sources are newer than its library: torch's JIT load in a
    rank would rebuild it inside the probe. ninja's own dry run (a real ninja, on a real build file) says so."""
    import os
    import shutil
    import subprocess
    import sys
    import time

    op = tmp_path / "cpu_adam"
    op.mkdir()
    src = op / "cpu_adam.cpp"
    (op / "build.ninja").write_text("rule cp\n  command = cp $in $out\nbuild cpu_adam.so: cp cpu_adam.cpp\n")
    src.write_text("// source\n")
    old = time.time() - 60
    os.utime(src, (old, old))
    ninja = shutil.which("ninja", path=str(Path(sys.executable).parent))
    assert ninja is not None
    subprocess.run([ninja, "-C", str(op)], check=True, capture_output=True)  # built (ninja's log records it)
    assert missing_ops(["cpu_adam"], tmp_path) == []
    os.utime(src, None)  # the source reinstalled after the build
    assert missing_ops(["cpu_adam"], tmp_path) == ["cpu_adam"]
