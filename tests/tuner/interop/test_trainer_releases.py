"""The export started as the user's Trainer starts it, under the transformers releases that fill warmup unclamped
(5.17.0 and 4.57.3: issue 30, point 2), beside this project's DeepSpeed: Seq2SeqTrainingArguments(deepspeed=...)
builds HfTrainerDeepSpeedConfig, trainer_config_finalize fills every "auto" as that release does, DeepSpeed parses the
result (DeepSpeedConfig) and builds its scheduler the way deepspeed.initialize does (on CPU, no model, no steps).

Each release is installed by the test itself with pip --target --no-deps into a cache folder (reused when complete)
and runs in a subprocess with PYTHONPATH=<that folder>, so its transformers (and the huggingface-hub / tokenizers
it pins) shadows the venv's. Without PyPI the test fails with one line: the check is the point of the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.servers import one_rank_env
from tuner.interop.baseline import parse_baseline
from tuner.interop.export import render
from tuner.interop.export.own import UserFiles
from tuner.settings import load_settings

SEED = Path(__file__).resolve().parents[2] / "data" / "seed"
#: each release with the dependencies it pins that the venv's newer ones do not satisfy
RELEASES: dict[str, tuple[str, ...]] = {
    "5.17.0": ("transformers==5.17.0", "huggingface-hub==1.33.0"),
    "4.57.3": ("transformers==4.57.3", "huggingface-hub==0.36.0", "tokenizers==0.22.1"),
}
#: the team's training args (tests/data/seed/training_args.json) as both releases take them: no warmup (0), no
#: overwrite_output_dir (gone in 5.0), no wandb
TEAM_ARGS: dict[str, Any] = {
    "output_dir": "out",
    "eval_strategy": "epoch",
    "save_strategy": "no",
    "learning_rate": 2e-5,
    "per_device_train_batch_size": 2,
    "per_device_eval_batch_size": 50,
    "weight_decay": 0.01,
    "num_train_epochs": 3,
    "predict_with_generate": True,
    "bf16": True,
    "report_to": "none",
}

START = r"""
import json, sys, tempfile
from types import SimpleNamespace
import torch, transformers, deepspeed
from transformers import Seq2SeqTrainingArguments
from deepspeed.runtime.config import DeepSpeedConfig, get_scheduler_name, get_scheduler_params
from deepspeed.runtime.engine import DeepSpeedEngine

kwargs = json.loads(sys.argv[1])
kwargs.pop("output_dir", None)
args = Seq2SeqTrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, **kwargs)
hf = args.hf_deepspeed_config  # HfTrainerDeepSpeedConfig: trainer_config_process ran in __post_init__
model = SimpleNamespace(config=transformers.T5Config(d_model=32))
hf.trainer_config_finalize(args, model, 1000)  # what the Trainer runs before deepspeed.initialize
config = hf.config
out = {"transformers": transformers.__version__, "deepspeed": deepspeed.__version__, "scheduler": config["scheduler"]}
DeepSpeedConfig(config)  # DeepSpeed parses it (world size 1: the one-rank group of the environment)
# DeepSpeed builds the scheduler the config names, as deepspeed.initialize does (engine._configure_lr_scheduler)
view = SimpleNamespace(scheduler_name=lambda: get_scheduler_name(config),
                       scheduler_params=lambda: get_scheduler_params(config))
optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
try:
    out["built"] = type(DeepSpeedEngine._scheduler_from_config(view, optimizer)).__name__
except ValueError as exc:
    out["refused"] = str(exc)
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
"""


def release_folder(version: str) -> Path:
    """The folder holding transformers ``version`` (pip --target --no-deps), installed once per cache."""
    folder = load_settings().cache_dir / "test-releases" / f"transformers-{version}"
    if (folder / ".complete").exists():
        return folder
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    specs = RELEASES[version]
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(partial), *specs]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        said = [ln for ln in done.stderr.splitlines() if ln.strip()]
        pytest.fail(
            f"cannot install {' '.join(specs)} with pip from PyPI into {partial} (this test needs PyPI): "
            f"{said[-1] if said else f'pip exited {done.returncode}'}",
            pytrace=False,
        )
    (partial / ".complete").write_text(" ".join(specs) + "\n")
    try:
        partial.rename(folder)
    except OSError:  # another test process installed it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def start(tmp_path: Path, version: str, training_args: dict[str, Any]) -> dict[str, Any]:
    """``training_args`` started as transformers ``version``'s Trainer starts them, up to the scheduler."""
    folder = release_folder(version)
    out = tmp_path / f"started-{version}.json"
    env = one_rank_env(PYTHONPATH=str(folder), TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(
        [sys.executable, "-c", START, json.dumps(training_args), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["transformers"] == version  # the release from the folder ran, not the venv's
    return result


def team_exports(version: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The hf and deepspeed exports of the team's baseline (their ZeRO-2 WarmupLR JSON, "auto" everywhere, and their
    training args without warmup) for a training host on transformers ``version``: the knobs of trial 0, re-tuned."""
    ds = json.loads((SEED / "ds_config.json").read_text())
    args = {**TEAM_ARGS, "deepspeed": ds}
    base = parse_baseline(ds, args, world_size=1, max_length=512)
    knobs = {**base.knobs, "overlap_comm": False, "micro_batch_size": 1}
    files = UserFiles.of(base.files())
    common: dict[str, Any] = {
        "world_size": 1,
        "gradient_accumulation_steps": 2,
        "baseline": base.ds_config,
        "files": files,
        "transformers_version": version,
    }
    hf = json.loads(render("hf", knobs, **common))
    deepspeed = json.loads(render("deepspeed", knobs, **common))
    return hf, deepspeed


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_the_exports_start_under_a_trainer_that_fills_warmup_unclamped(tmp_path: Path, version: str) -> None:
    hf, deepspeed = team_exports(version)
    # the hf export as it is: training args with the DeepSpeed section inline
    started = start(tmp_path, version, hf)
    assert "refused" not in started, started
    assert started["built"] == "WarmupLR" and started["scheduler"]["params"]["warmup_num_steps"] == 1
    # the deepspeed export as a file beside the exported training args (`--deepspeed ds.json`)
    started = start(tmp_path, version, {**hf, "deepspeed": deepspeed})
    assert "refused" not in started, started
    assert started["scheduler"]["params"]["warmup_num_steps"] == 1


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_the_users_own_files_are_refused_there(tmp_path: Path, version: str) -> None:
    """What the exports fix is real: their own files stop there with DeepSpeed's reason (the issue's crash)."""
    ds = json.loads((SEED / "ds_config.json").read_text())
    started = start(tmp_path, version, {**TEAM_ARGS, "deepspeed": ds})
    assert started["refused"] == "warmup_num_steps must be a positive integer, got 0"
    assert started["scheduler"]["params"]["warmup_num_steps"] == 0
