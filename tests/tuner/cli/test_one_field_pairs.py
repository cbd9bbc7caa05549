"""The one-field pairs of issue 38, through the commands a user types: a training-args file (micro 4 x accumulation
4, bf16, eval every 100 steps at batch 4) and the same file with ONE field added. `tuner search --dry-run` of each
either prints something else (what the probe runs changed) or refuses the file in one line, exit 2 — never the same
plan for a different job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BASE: dict[str, Any] = {
    "output_dir": "out",
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 4,
    "bf16": True,
    "eval_strategy": "steps",
    "eval_steps": 100,
    "per_device_eval_batch_size": 4,
    "max_seq_length": 64,
}
CHANGED = {
    "adafactor": {"optim": "adafactor"},
    "sgd": {"optim": "sgd"},
    "no-eval": {"eval_strategy": "no"},
    "compile": {"torch_compile": True},
    "grouped": {"train_sampling_strategy": "group_by_length"},
    "smoothing": {"label_smoothing_factor": 0.1},
    "empty-cache": {"torch_empty_cache_steps": 10},
    "eval-accumulation": {"eval_accumulation_steps": 4},
    "tf32": {"tf32": True},
    "neftune": {"neftune_noise_alpha": 5.0},
    "determinism": {"full_determinism": True},
}
REFUSED = {
    "adamw_8bit": ({"optim": "adamw_8bit"}, "bitsandbytes"),  # not installed here: one line, the fix
    "liger": ({"use_liger_kernel": True}, "liger"),
    "unknown-field": ({"evaluation_strategy": "steps"}, "did you mean 'eval_strategy'"),
    "mismatch": ({"load_best_model_at_end": True, "save_strategy": "epoch"}, "save and eval strategy to match"),
}


def dry_run(tmp_path: Path, name: str, args: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(args))
    tuner = Path(sys.executable).with_name("tuner")
    cmd = [str(tuner), "search", "--model", "builtin:tiny-llama", "--baseline", str(path), "--budget", "2m"]
    cmd += ["--study", "pairs", "--storage", f"sqlite:///{tmp_path / 'pairs.db'}", "--dry-run"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.fixture(scope="module")
def base_plan(tmp_path_factory: pytest.TempPathFactory) -> str:
    done = dry_run(tmp_path_factory.mktemp("base"), "base", BASE)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHANGED))
def test_each_run_field_changes_what_the_dry_run_prints(tmp_path: Path, base_plan: str, name: str) -> None:
    done = dry_run(tmp_path, name, {**BASE, **CHANGED[name]})
    assert done.returncode == 0, done.stderr
    assert done.stdout != base_plan
    job = next(line for line in done.stdout.splitlines() if line.startswith("your job"))
    assert job not in base_plan  # the job line says it


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_refused_field_is_one_line_exit_2(tmp_path: Path, name: str) -> None:
    extra, said = REFUSED[name]
    done = dry_run(tmp_path, name, {**BASE, **extra})
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "pairs.db").exists() or done.stdout == ""  # nothing planned past the refusal


@pytest.mark.slow
def test_checkpointing_keywords_beside_checkpointing_on_change_the_plan(tmp_path: Path) -> None:
    on = {**BASE, "gradient_checkpointing": True}
    plain, keyed = dry_run(tmp_path, "on", on), dry_run(tmp_path, "kw", {**on, "gradient_checkpointing_kwargs": {}})
    assert plain.returncode == keyed.returncode == 0
    reentrant = dry_run(tmp_path, "re", {**on, "gradient_checkpointing_kwargs": {"use_reentrant": True}})
    assert reentrant.returncode == 0 and reentrant.stdout != plain.stdout and "use_reentrant" in reentrant.stdout
