"""Issue 38 (nothing switched): the engine of their files is the engine searched. An accelerate FSDP2 config with its
training args and no --space searches FSDP2 only (its resharding and parameter offload, never a ZeRO stage) and
exports FSDP2; the dry run lists no ZeRO knob. Real probes: builtin:tiny-llama on 2 gloo ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

TUNER = str(Path(sys.executable).with_name("tuner"))
ARGS = {"output_dir": "out", "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "max_seq_length": 64}
ACCELERATE: dict[str, Any] = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "FSDP",
    "mixed_precision": "no",
    "num_processes": 2,
    "fsdp_config": {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": True,
        "fsdp_offload_params": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    },
}


def tuner(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([TUNER, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False)


def their_files(d: Path) -> list[str]:
    (d / "accelerate.yaml").write_text(yaml.safe_dump(ACCELERATE))
    (d / "args.json").write_text(json.dumps(ARGS))
    files = ["--baseline", str(d / "accelerate.yaml"), "--training-args", str(d / "args.json")]
    return ["--model", "builtin:tiny-llama", *files, "--device-memory", "64MiB"]


def test_the_dry_run_of_an_fsdp2_config_searches_fsdp2_knobs_and_no_zero_stage(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    done = tuner("search", "--dry-run", "--budget", "1m", *their_files(tmp_path), "--storage", url)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    searched = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("searched: ")]
    assert any("reshard_after_forward" in line for line in searched)
    assert any("offload_params" in line for line in searched)
    assert not any("zero_stage" in line or "bucket" in line or "offload_optimizer" in line for line in searched)


def test_a_deepspeed_json_searches_deepspeed_and_training_args_alone_plain_pytorch(tmp_path: Path) -> None:
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    (tmp_path / "args.json").write_text(json.dumps(ARGS))
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    common = ["search", "--dry-run", "--budget", "1m", "--model", "builtin:tiny-llama", "--storage", url]
    deepspeed = tuner(*common, "--baseline", str(tmp_path / "ds.json"), "--max-length", "64")
    assert deepspeed.returncode == 0, deepspeed.stderr[-2000:]
    assert "searched: zero_stage: 0, 1, 2, 3" in deepspeed.stdout and "reshard_after_forward" not in deepspeed.stdout
    torch = tuner(*common, "--baseline", str(tmp_path / "args.json"))
    assert torch.returncode == 0, torch.stderr[-2000:]
    assert "zero_stage" not in torch.stdout and "reshard_after_forward" not in torch.stdout
    listed = tmp_path / "space.yaml"  # a space file naming engines searches them
    listed.write_text("engine: [torch, deepspeed]\n")
    both = tuner(*common, "--baseline", str(tmp_path / "args.json"), "--space", str(listed))
    assert both.returncode == 0, both.stderr[-2000:]
    assert "searched: engine: torch, deepspeed" in both.stdout and "searched: zero_stage" in both.stdout


@pytest.mark.slow
def test_an_fsdp2_config_with_its_training_args_searches_and_exports_fsdp2(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    done = tuner(
        "search", "--budget", "90s", *their_files(tmp_path), "--n-trials", "3", "--finalists", "0", "--no-estimate",
        "--storage", url, "--study", "theirs", "--seed", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    listed = tuner("trials", "--storage", url, "--study", "theirs", "--json").stdout
    rows = [json.loads(line) for line in listed.splitlines() if line.strip()]
    assert len(rows) >= 2, listed
    assert all(row["knobs"]["engine"] == "fsdp2" for row in rows), listed
    out = tmp_path / "exported.yaml"
    exported = tuner("best", "--storage", url, "--study", "theirs", "--format", "accelerate", "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    config = yaml.safe_load(out.read_text())
    assert config["distributed_type"] == "FSDP" and config["fsdp_config"]["fsdp_version"] == 2
    assert "deepspeed_config" not in config


@pytest.mark.slow
def test_a_global_batch_asked_for_as_a_change_is_listed_by_changes(tmp_path: Path) -> None:
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 0}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    (tmp_path / "space.yaml").write_text("micro_batch_size: [2]\nzero_stage: [0]\ngradient_checkpointing: [false]\n")
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    done = tuner(
        "search", "--budget", "90s", "--model", "builtin:tiny-t5", "--baseline", str(tmp_path / "ds.json"),
        "--space", str(tmp_path / "space.yaml"), "--global-batch", "8", "--change-global-batch", "--n-trials", "1",
        "--finalists", "0", "--no-estimate", "--device-memory", "1GiB", "--storage", url, "--study", "changed",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    changes = tuner("best", "--storage", url, "--study", "changed", "--changes").stdout
    assert "your job: global batch (micro x accumulation x world): 4 -> 8" in changes, changes
