"""`tuner export --format recipe` / `tuner best --format recipe` through the real entry point: a study whose baseline
was a TRL recipe in YAML gets its recipe back, YAML, their keys in their order with the tuned fields changed, and
TRL's own TrlParser (TRL 1.16.0 beside the venv, tests/tuner/job/test_ledger_trl.py's trl_folder) reads it into
SFTConfig + ModelConfig with the tuned values; `--changes` speaks in the recipe's keys; a study without a recipe
baseline is refused in one line, exit 2 (tuner.interop.export.recipe)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.sample_storage import populate
from tests.tuner.job.test_ledger_trl import trl_folder

TUNER = str(Path(sys.executable).with_name("tuner"))
RECIPE = """\
# their SFT recipe, as TRL's scripts take it
model_name_or_path: builtin:tiny-llama
output_dir: out
per_device_train_batch_size: 16
gradient_accumulation_steps: 1
max_length: 128
packing: true
packing_strategy: wrapped
bf16: false
gradient_checkpointing: true
learning_rate: 1.0e-4
dataset_name: their/data
"""
SPACE = "micro_batch_size: [2, 4]\nzero_stage: [0]\ngradient_checkpointing: [false]\n"
PARSE = """
import json, sys
from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser
parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig))
script, sft, model = parser.parse_args_and_config(["--config", sys.argv[1]])
print(json.dumps({"micro": sft.per_device_train_batch_size, "accum": sft.gradient_accumulation_steps,
    "ckpt": sft.gradient_checkpointing, "bf16": sft.bf16, "packing": sft.packing, "strategy": sft.packing_strategy,
    "max_length": sft.max_length, "lr": sft.learning_rate, "model": model.model_name_or_path,
    "dataset": script.dataset_name}))
"""


def tuner(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": "", "TUNER_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([TUNER, *args], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)


def test_a_study_without_a_recipe_baseline_is_refused_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    populate(url, "t5-demo")
    done = tuner(tmp_path, "best", "--study", "t5-demo", "--storage", url, "--format", "recipe")
    assert done.returncode == 2, done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and "--format recipe writes back a TRL recipe" in said[0], done.stderr
    assert "use --format hf" in said[0]


@pytest.mark.slow
def test_the_recipe_export_is_their_yaml_with_the_tuned_fields_and_trl_reads_it(tmp_path: Path) -> None:
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    (tmp_path / "space.yaml").write_text(SPACE)
    url = f"sqlite:///{tmp_path}/t.db"
    # micro 16 with checkpointing needs more than 9 MiB on builtin:tiny-llama at 128 tokens: the search picks micro 2
    # (6.5 MiB measured) without checkpointing, accumulating to their global batch 16
    done = tuner(
        tmp_path,
        *("search", "--model", "builtin:tiny-llama", "--baseline", "recipe.yaml", "--space", "space.yaml"),
        *("--storage", url, "--study", "rec", "--budget", "5m", "--n-trials", "2", "--finalists", "0"),
        *("--device-memory", "9MiB"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    export = tuner(tmp_path, "export", "--study", "rec", "--storage", url, "--format", "recipe", "-o", "tuned.yaml")
    assert export.returncode == 0, export.stderr
    text = (tmp_path / "tuned.yaml").read_text()
    tuned = yaml.safe_load(text)
    given = yaml.safe_load(RECIPE)
    assert list(tuned)[: len(given)] == list(given)  # their keys, in their order; the export's after them
    micro = tuned["per_device_train_batch_size"]
    assert micro in (2, 4) and tuned["gradient_accumulation_steps"] * micro == 16
    assert tuned["gradient_checkpointing"] is False and "activation_checkpointing" not in tuned
    assert {k: tuned[k] for k in ("packing", "packing_strategy", "learning_rate", "dataset_name")} == {
        k: given[k] for k in ("packing", "packing_strategy", "learning_rate", "dataset_name")
    }
    best = tuner(tmp_path, "best", "--study", "rec", "--storage", url, "--format", "recipe")
    assert best.returncode == 0 and best.stdout.strip() == text.strip()  # one code path for both commands

    env = {**os.environ, "PYTHONPATH": str(trl_folder())}
    parsed = subprocess.run(
        [sys.executable, "-c", PARSE, str(tmp_path / "tuned.yaml")], capture_output=True, text=True, env=env
    )
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    read = json.loads(parsed.stdout.strip().splitlines()[-1])
    assert read == {
        "micro": micro,
        "accum": 16 // micro,
        "ckpt": False,
        "bf16": False,
        "packing": True,
        "strategy": "wrapped",
        "max_length": 128,
        "lr": 1e-4,
        "model": "builtin:tiny-llama",
        "dataset": "their/data",
    }

    changes = tuner(tmp_path, "best", "--study", "rec", "--storage", url, "--changes").stdout
    assert f"training args: per_device_train_batch_size: 16 -> {micro}" in changes, changes
    assert "training args: gradient_checkpointing: True -> False" in changes
    assert "activation_checkpointing" not in changes.split("held fixed")[0]
