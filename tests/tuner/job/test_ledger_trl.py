"""The TRL half of the ledger (tuner.job.ledger.trl) against TRL itself: every field of TRL 1.16.0's SFTConfig and
DPOConfig beyond TrainingArguments', and every field of its ModelConfig, has a verdict; and the recorded lists (and
the defaults each config changes) are the release's own, read from TRL installed beside the venv with pip --target
--no-deps (TRL is not a dependency of tuner: it never enters the venv), as tests/tuner/interop/test_trainer_releases.py
installs transformers releases. Without PyPI the second test fails with one line: the check is the point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.job.ledger import REFUSED
from tuner.job.ledger.trl import DPO_FIELDS, MODEL_FIELDS, SFT_FIELDS, TRL_RELEASE, read_recipe, trl_fields
from tuner.settings import load_settings

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "ledger_trl_fields.py"
READ = "import json, runpy, sys; print(json.dumps(runpy.run_path(sys.argv[1])['trl_fields']()))"


def trl_folder(version: str = TRL_RELEASE) -> Path:
    """The folder holding trl ``version`` (pip --target --no-deps), installed once per cache."""
    folder = load_settings().cache_dir / "test-releases" / f"trl-{version}"
    if (folder / ".complete").exists():
        return folder
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(partial), f"trl=={version}"]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        said = [ln for ln in done.stderr.splitlines() if ln.strip()]
        pytest.fail(
            f"cannot install trl=={version} with pip from PyPI into {partial} (this test needs PyPI): "
            f"{said[-1] if said else f'pip exited {done.returncode}'}",
            pytrace=False,
        )
    (partial / ".complete").write_text(f"trl=={version}\n")
    shutil.rmtree(folder, ignore_errors=True)  # an unmarked folder: a copy nobody finished
    try:
        partial.rename(folder)
    except OSError:  # another test process installed it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def test_every_field_of_the_recorded_trl_release_has_a_verdict_that_says_why() -> None:
    data = trl_fields()
    assert data["release"] == TRL_RELEASE
    for table, name in ((SFT_FIELDS, "SFTConfig"), (DPO_FIELDS, "DPOConfig"), (MODEL_FIELDS, "ModelConfig")):
        assert set(table) == set(data[name]), (
            f"{name} fields nobody classified (or gone): {set(data[name]) ^ set(table)}"
        )
        for key, entry in table.items():
            assert entry.why, key
            assert entry.verdict != REFUSED or entry.fix, f"{key}: a refusal says the fix"
            assert entry.refuse is None or entry.fix, f"{key}: a refused value says the fix"
    # a field's own default is never refused: "set it to its default" is always a fix that works
    for table, name in ((SFT_FIELDS, "SFTConfig"), (DPO_FIELDS, "DPOConfig")):
        for key, default in data[f"{name}_own_defaults"].items():
            assert table[key].refusal(default) is None, f"{name}.{key}: its default {default!r} is refused"
    for key, default in data["ModelConfig_defaults"].items():
        assert MODEL_FIELDS[key].refusal(default) is None, f"ModelConfig.{key}: its default {default!r} is refused"
    # what TRL 1.16 changes of TrainingArguments' defaults, as recorded from the dataclasses
    for config in ("SFTConfig_defaults", "DPOConfig_defaults"):
        assert data[config]["gradient_checkpointing"] is True and data[config]["bf16"] is None
    assert data["SFTConfig_defaults"]["learning_rate"] == 2e-5


def test_the_recorded_lists_are_the_installed_releases_own() -> None:
    env = {**os.environ, "PYTHONPATH": str(trl_folder())}
    done = subprocess.run([sys.executable, "-c", READ, str(SCRIPT)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == trl_fields()


def test_a_recipe_is_told_by_its_config_class_only_keys() -> None:
    sft = read_recipe({"max_length": 512, "packing": False})
    assert sft.kind == "sft" and "packing" in sft.why
    assert sft.defaults == {"learning_rate": 2e-5, "gradient_checkpointing": True, "logging_steps": 10, "bf16": True}
    assert read_recipe({"beta": 0.1, "fp16": True}).defaults["bf16"] is False  # bf16 only where fp16 is not set
    assert read_recipe({"beta": 0.1}).kind == "dpo"
    assert read_recipe({"use_peft": True, "lora_r": 8}).kind == "sft"  # ModelConfig only: read as SFT, said so
    assert read_recipe({"max_length": 512, "learning_rate": 1e-4}).kind is None  # a plain file stays plain
    with pytest.raises(ValueError, match="one config class"):
        read_recipe({"packing": True, "beta": 0.1})
