"""Ops loaded in the zygote (issue 30 §3): the fork server loads the DeepSpeed ops already in the op cache once, so a
forked rank finds them loaded instead of importing them inside its fixed cost (an offloaded probe's cpu_adam: 2.7 s
of a 4.4 s fixed cost on this machine, BENCHMARKS.md). Nothing is compiled by the server: it is given only the ops the
runner found built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trials.contract import Knobs
from tuner.probing import forkserver
from tuner.probing.config import probe_config
from tuner.probing.environment import probe_env
from tuner.probing.ops import build_ops
from tuner.probing.runner import run_probe


def test_the_server_is_given_only_built_ops(tmp_path: Path) -> None:
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    assert forkserver.built_ops(env) == []  # an empty cache: nothing to load, nothing compiled
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    assert forkserver.built_ops(env) == ["cpu_adam"]


@pytest.mark.slow
def test_a_forked_offload_rank_finds_cpu_adam_loaded() -> None:
    env = probe_env(1)
    assert [b.outcome for b in build_ops(["cpu_adam", "shm_comm"], env)] in (["cached", "cached"], ["built", "built"])
    code = (
        "import os; from trials.forkserver import preload_ops; "
        "print(preload_ops(os.environ['TUNER_PRELOAD_OPS'])); "
        "from deepspeed.ops.op_builder.builder import OpBuilder; print(sorted(OpBuilder._loaded_ops))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "TUNER_PRELOAD_OPS": ",".join(forkserver.built_ops(env))},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stdout.strip().splitlines()
    assert lines[-2] == "['cpu_adam', 'shm_comm']" and "cpu_adam" in lines[-1], done.stderr[-2000:]
    forkserver.shutdown()  # a server started now is given both
    knobs = Knobs(micro_batch_size=2, max_length=16, zero_stage=2, offload_optimizer=True)
    result = run_probe(probe_config(knobs=knobs, gradient_accumulation_steps=2, timeout_s=240), launcher="forkserver")
    assert result.status == "ok", result.cause
    assert "engine.ops" in result.setup_phases  # recorded apart from deepspeed.initialize, loaded or not
