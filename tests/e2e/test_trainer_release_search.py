"""A search for a training host whose transformers fills warmup unclamped (5.17.0) beside this project's DeepSpeed
(issue 30, point 2), through the real entry point: trial 0 runs the team's files as that Trainer fills them and is
refused before launching with DeepSpeed's reason; the search's probes run warmup 1, as the exports write it; `tuner
best` writes it for the study's release and `--changes` lists it with why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TUNER = str(Path(sys.executable).with_name("tuner"))
SEED = Path(__file__).resolve().parents[1] / "data" / "seed"
REFUSED = "ValueError: warmup_num_steps must be a positive integer, got 0"


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([TUNER, *args], capture_output=True, text=True, timeout=600, env=env, check=False)


@pytest.mark.slow
def test_trial_0_is_refused_as_their_trainer_and_the_search_runs_what_the_export_gives(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch_size: [1, 2]\nzero_stage: [0, 1]\ngradient_checkpointing: [false]\n")
    url = f"sqlite:///{tmp_path}/tuner.db"
    common = ["--storage", url, "--study", "t517"]
    # their files as a transformers 5 Trainer takes them: overwrite_output_dir (4.x) dropped, the rest verbatim
    theirs = json.loads((SEED / "training_args.json").read_text())
    theirs.pop("overwrite_output_dir")
    theirs["deepspeed"] = str(SEED / "ds_config.json")
    (tmp_path / "training_args.json").write_text(json.dumps(theirs))
    done = tuner(
        "search",
        *common,
        "--model",
        "builtin:tiny-t5",
        "--budget",
        "3m",
        "--space",
        str(space),
        "--device-memory",
        "160MiB",
        "--baseline",
        str(tmp_path / "training_args.json"),
        "--max-length",
        "32",
        "--max-target-length",
        "16",
        "--n-trials",
        "1",
        "--finalists",
        "0",
        "--transformers-version",
        "5.17.0",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    from tuner.storage import Store

    rows = Store(url).probes("t517")
    first, rest = rows[0], rows[1:]
    assert first.fidelity == "baseline" and first.status == "refused" and not first.probe_seconds  # never launched
    assert first.cause is not None and REFUSED in first.cause and first.cause.startswith("refused before launching")
    assert first.config["deepspeed"]["scheduler"]["params"]["warmup_num_steps"] == 0  # their Trainer's fill
    assert rest and all(r.config["deepspeed"]["scheduler"]["params"]["warmup_num_steps"] == 1 for r in rest)
    assert any(r.status == "ok" for r in rest)
    # the exports for the study's release (5.17.0, stored): warmup 1 written out, listed with why
    hf = json.loads(tuner("best", *common, "--format", "hf").stdout)
    assert hf["warmup_steps"] == 1 and hf["deepspeed"]["scheduler"]["params"]["warmup_num_steps"] == 1
    changes = tuner("best", *common, "--changes").stdout
    assert "training args: warmup_steps: (unset) -> 1 (for your Trainer: transformers 5.17.0 fills" in changes
    assert "deepspeed: scheduler.params.warmup_num_steps: 'auto' -> 1 (for your Trainer:" in changes
    assert "your config cannot start as it stands (refused before launching: deepspeed" in changes
    # for a training host whose Trainer clamps, their files stay: it fills the 1 the probes ran itself
    later = tuner("best", *common, "--changes", "--transformers-version", "5.25.0").stdout
    listed = [line for line in later.splitlines() if line.startswith(("training args:", "deepspeed:"))]
    assert listed and not [line for line in listed if "warmup" in line]


def test_a_bad_transformers_version_is_one_line(tmp_path: Path) -> None:
    done = tuner("search", "--budget", "1m", "--storage", f"sqlite:///{tmp_path}/t.db", "--transformers-version", "x")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: --transformers-version 'x' is not a version; give your training host's, e.g. 4.46.3"
    ]
