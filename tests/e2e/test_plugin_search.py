"""alignment-handbook's ZeRO-3 recipe (recipes/accelerate_configs/zero3.yaml: accelerate's DeepSpeed plugin, no
DeepSpeed JSON) through `tuner search`: searched, not refused; trial 0 is their config (ZeRO-3 as accelerate's
DeepSpeedPlugin builds it, the Trainer's "auto" filled from their training args), and the accelerate export stays a
DeepSpeed launch."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TUNER = str(Path(sys.executable).with_name("tuner"))
# the recipe as published (num_processes 8), then set to the 2 ranks this test runs
ZERO3 = (Path(__file__).resolve().parents[1] / "data" / "handbook-zero3.yaml").read_text()
ARGS = {"output_dir": "out", "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "bf16": True}


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([TUNER, *args], capture_output=True, text=True, timeout=400, env=env, check=False)


@pytest.mark.slow
def test_the_handbook_zero3_recipe_is_searched_from_its_own_config(tmp_path: Path) -> None:
    config = tmp_path / "zero3.yaml"
    config.write_text(ZERO3.replace("num_processes: 8", "num_processes: 2"))
    args = tmp_path / "args.json"
    args.write_text(json.dumps({**ARGS, "max_seq_length": 64}))
    db = tmp_path / "tuner.db"
    url = f"sqlite:///{db}"
    done = tuner(
        "search", "--model", "builtin:tiny-llama", "--baseline", str(config), "--training-args", str(args),
        "--world-size", "2", "--device-memory", "256MiB", "--budget", "1m30s", "--n-trials", "2",
        "--storage", url, "--study", "z3", "--seed", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "z3" in next(line for line in done.stdout.splitlines() if "(baseline)" in line)
    with sqlite3.connect(db) as con:
        first = [json.loads(k) for (k,) in con.execute("select knobs from tuner_probes where trial_number = 0")]
    assert first and all(k["engine"] == "deepspeed" and k["zero_stage"] == 3 for k in first)
    assert all(k["precision"] == "bf16" and k["micro_batch_size"] == 2 for k in first)
    exported = tuner("best", "--storage", url, "--study", "z3", "--format", "accelerate")
    assert exported.returncode == 0, exported.stderr
    launch = yaml.safe_load(exported.stdout)
    assert launch["distributed_type"] == "DEEPSPEED" and launch["num_processes"] == 2
    assert launch["deepspeed_config"]["deepspeed_config_file"] == "ds_config.json"


SPACE = """micro_batch_size: [2]
zero_stage: [3]
offload_param: [false, true]
offload_optimizer: [false]
reduce_bucket_size: [50000]
overlap_comm: [false]
gradient_checkpointing: [false]
"""


@pytest.mark.slow
def test_zero3_parameter_offload_is_a_knob_the_search_probes_on_two_ranks(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    db = tmp_path / "tuner.db"
    done = tuner(
        "search", "--model", "builtin:tiny-llama", "--world-size", "2", "--device-memory", "64MiB",
        "--space", str(space), "--n-trials", "2", "--max-length", "32", "--global-batch", "4", "--budget", "1m30s",
        "--storage", f"sqlite:///{db}", "--study", "o", "--seed", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with sqlite3.connect(db) as con:
        rows = [(s, json.loads(k)) for s, k in con.execute("select status, knobs from tuner_probes")]
    assert {bool(k.get("offload_param")) for s, k in rows if s == "ok" and k["zero_stage"] == 3} == {False, True}
    assert "offload-params" in done.stdout
