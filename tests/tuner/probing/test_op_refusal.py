"""No probe compiles an op inside its clock (issue 30 §1): each op is built on its own before the probe, a failed build
is one typed refusal naming the op and the compiler's reason, and `tuner prepare` reports each op. The failing builds
are real: DeepSpeed's builder, torch's JIT and ninja run with a C++ compiler that refuses every source file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trials.contract import Knobs, Status
from trials.ops import compiler_reason
from tuner.probing import ops as launch_ops
from tuner.probing.config import probe_config
from tuner.probing.ops import OpBuild, ensure_ops, refusal
from tuner.probing.runner import ProbeRunner
from tuner.settings import load_settings

FAILING_CXX = """#!/bin/sh
for a in "$@"; do [ "$a" = "--version" ] && exec c++ "$@"; done
echo "fatal error: Python.h: No such file or directory" >&2
exit 1
"""


@pytest.fixture
def broken_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A compiler that fails every compile (as a host without the Python headers does), a fresh op cache."""
    cxx = tmp_path / "bin" / "c++"
    cxx.parent.mkdir()
    cxx.write_text(FAILING_CXX)
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(launch_ops, "_FAILED", {})
    return cxx


def test_the_reason_is_the_compilers_line() -> None:
    torch_said = (
        "RuntimeError: Error building extension 'cpu_adam': [1/3] /usr/bin/c++ -DTORCH_ERROR_X -c cpu_adam.cpp\n"
        "FAILED: cpu_adam.o\n/usr/bin/c++ -MMD cpu_adam.cpp\n"
        "cpu_adam.cpp:1:10: fatal error: Python.h: No such file or directory\nninja: build stopped: subcommand failed."
    )
    assert compiler_reason(torch_said) == "cpu_adam.cpp:1:10: fatal error: Python.h: No such file or directory"
    assert compiler_reason("ValueError: invalid literal for int() with base 10: '0a'").endswith("'0a'")
    assert len(compiler_reason("error: " + "x" * 10_000)) == 300
    assert compiler_reason("") == "no output"


def test_a_failed_build_refuses_the_probe_before_it_starts(broken_compiler: Path) -> None:
    """Before: the build's failure was swallowed and the probe's ranks compiled the op themselves inside the probe's
    clock (45 s of a 50.8 s fixed cost on the H200), or failed at their first step with a bare error."""
    config = probe_config(knobs=Knobs(micro_batch_size=1, max_length=8, zero_stage=1, offload_optimizer=True))
    runner = ProbeRunner(load_settings(), "spawn")
    result = runner(config)
    assert result.status is Status.REFUSED
    assert result.cause is not None and "cpu_adam" in result.cause
    assert "fatal error: Python.h: No such file or directory" in result.cause
    assert result.ranks == [] and result.setup_s is None  # no rank was started
    again = ensure_ops(config, runner.env(1))  # the same reason at once: no second build in this process
    assert [b.outcome for b in again if b.op == "cpu_adam"] == ["failed"]


def test_refusal_names_only_failed_ops() -> None:
    assert refusal([OpBuild("cpu_adam", "cached"), OpBuild("fused_adam", "not-needed", "not used")]) is None
    said = refusal([OpBuild("cpu_adam", "built"), OpBuild("fused_adam", "failed", "ValueError: '0a'")])
    assert said is not None and said.startswith("DeepSpeed op(s) fused_adam could not be built (fused_adam: ValueError")


def test_prepare_reports_each_op(broken_compiler: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "prepare"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("op cache ")
    assert "  cpu_adam: failed (fatal error: Python.h: No such file or directory)" in lines
    assert "  shm_comm: failed (fatal error: Python.h: No such file or directory)" in lines
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "cpu_adam, shm_comm" in done.stderr
