"""The Python API: tuner.tune runs a real search in-process (real probes of the tiny T5 on a 160 MiB emulated
device), tuner.best_config hands back what `tuner best` does, tuner.estimate what `tuner estimate` does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tuner
from tuner.errors import BudgetError, ConfigError, NoStableConfig, StudyNotFound

SPACE = {"micro_batch_size": [2, 32], "zero_stage": [0], "gradient_checkpointing": [False]}


def test_import_tuner_stays_light() -> None:
    """``import tuner`` loads no training stack (the API imports on first use)."""
    code = "import sys, tuner; assert callable(tuner.tune); print([m for m in ('torch', 'optuna') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# tuner.tune running a real search, and best_config handing back what it picked: in
# tests/tuner/integrations/test_transformers_loop.py, whose study then trains under the Trainer (one search for both).


def test_api_mistakes_are_typed_one_line_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/tuner.db"
    with pytest.raises(BudgetError, match="'soon' is not a duration"):
        tuner.tune(budget="soon", storage=url)
    with pytest.raises(ConfigError, match="unknown settings max_lenght"):
        tuner.tune(budget="1m", storage=url, max_lenght=128)
    with pytest.raises(ConfigError, match="global batch 7 cannot be reached by any micro_batch_size"):
        tuner.tune(budget="1m", storage=url, space=SPACE, global_batch=7)
    with pytest.raises(StudyNotFound, match="no study"):
        tuner.best_config(storage=url)
    with pytest.raises(ConfigError, match="unknown format"):
        tuner.best_config("x", storage=url, format="yaml")


def test_best_config_without_a_stable_config_says_so(tmp_path: Path) -> None:
    from tuner.storage import Store

    url = f"sqlite:///{tmp_path}/tuner.db"
    Store(url).ensure_study("empty", {"model": {}})
    with pytest.raises(NoStableConfig, match="'empty' has no stable config"):
        tuner.best_config("empty", storage=url)


def test_estimate_predicts_one_config() -> None:
    small = tuner.estimate("builtin:tiny-t5", {"micro_batch_size": 2, "max_length": 64, "zero_stage": 0})
    large = tuner.estimate("builtin:tiny-t5", {"micro_batch_size": 16, "max_length": 64, "zero_stage": 0})
    assert 0 < small.raw < large.raw and large.activations > small.activations
    with pytest.raises(ConfigError, match="micro_batch_size"):
        tuner.estimate("builtin:tiny-t5", {"micro_batch_size": 0, "max_length": 64})


def test_dry_run_says_what_the_search_would_do_and_writes_nothing(tmp_path: Path) -> None:
    """`tuner search --dry-run`: the job, the space, what the memory estimate rules out, the expected probes; no
    storage written, no probe run."""
    db = tmp_path / "tuner.db"
    tuner_bin = Path(sys.executable).with_name("tuner")
    done = subprocess.run(
        [
            str(tuner_bin),
            "search",
            "--budget",
            "30m",
            "--storage",
            f"sqlite:///{db}",
            "--device-memory",
            "160MiB",
            "--space",
            str(_space_file(tmp_path)),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "your job (held fixed): fp32, length 128, no eval step" in done.stdout
    assert "space: 2 configs; " in done.stdout and "ruled out by the memory estimate" in done.stdout
    ruled = int(done.stdout.split("space: 2 configs; ")[1].split()[0])
    assert f"expected: at most about {2 - ruled} probes" in done.stdout and not db.exists()
    assert "  searched: micro_batch_size: 2, 32" in done.stdout  # the one knob with more than one choice
    assert "ruled out = predicted peak above 1.5 x the device memory (240 MiB)" in done.stdout


def test_dry_run_predicts_the_baseline_phase_by_phase(tmp_path: Path) -> None:
    """With a baseline, the dry run prints its predicted peak per phase against the device memory (the one shared
    estimate: the same numbers `tuner estimate` prints)."""
    baseline = tmp_path / "ds.json"
    baseline.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}}))
    tuner_bin = Path(sys.executable).with_name("tuner")
    args = ["search", "--budget", "30m", "--storage", f"sqlite:///{tmp_path / 'tuner.db'}", "--device-memory", "1MiB"]
    args += ["--space", str(_space_file(tmp_path)), "--baseline", str(baseline), "--dry-run"]
    args += ["--model", "builtin:tiny-t5"]
    done = subprocess.run([str(tuner_bin), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "your baseline, predicted peak per rank of 1 MiB device memory (uncalibrated):" in done.stdout
    assert "  train forward + backward: " in done.stdout and "  optimizer step: " in done.stdout
    assert " MiB OVER" in done.stdout and "not covered: the CUDA context" in done.stdout


def _space_file(tmp_path: Path) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text("micro_batch_size: [2, 32]\nzero_stage: [0]\ngradient_checkpointing: [false]\n")
    return path
