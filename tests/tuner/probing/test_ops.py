"""Which DeepSpeed ops a probe needs before its clock starts, and the build's locking."""

from __future__ import annotations

import os
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


def test_missing_ops_looks_for_the_built_library(tmp_path: Path) -> None:
    assert missing_ops(["cpu_adam", "shm_comm"], tmp_path) == ["cpu_adam", "shm_comm"]
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "lock").write_text("")  # a build in progress is not a built op
    assert missing_ops(["cpu_adam"], tmp_path) == ["cpu_adam"]
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    assert missing_ops(["cpu_adam", "shm_comm"], tmp_path) == ["shm_comm"]


def test_a_dead_builds_lock_is_cleared_before_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build killed from outside (kill -9 of a runner) leaves torch's FileBaton lock; every later load would wait on
    it until the probe's timeout. The next build, under tuner's flock, removes it first. The compiler is replaced by a
    stand-in that records whether the lock was still there (the real build runs in
    tests/tuner/probing/test_runner.py)."""
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "lock").write_text("")
    seen: dict[str, bool] = {}

    class Build:
        def __init__(self, args: list[str], **_: object) -> None:
            seen["lock"] = (tmp_path / "cpu_adam" / "lock").exists()
            (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
            self.pid = os.getpid()

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(launch_ops.subprocess, "Popen", Build)
    monkeypatch.setattr(launch_ops.launch_forkserver, "usable", lambda: True)
    built = ensure_ops(_cfg(zero_stage=1, offload_optimizer=True), {"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert seen == {"lock": False} and built == ["cpu_adam"]


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
