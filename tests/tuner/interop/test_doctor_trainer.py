"""`tuner doctor` names the pair the user trains with (their transformers, the DeepSpeed that runs it) when DeepSpeed
refuses the scheduler their Trainer fills, with the one-line fix (issue 30, point 2). DeepSpeed's verdict is its own
(tuner.probing.schedule_check, on CPU)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.interop.doctor import diagnose
from tuner.probing.schedule_check import check_schedule

SEED = Path(__file__).resolve().parents[2] / "data" / "seed"
DS = json.loads((SEED / "ds_config.json").read_text())
ARGS = {"per_device_train_batch_size": 2, "bf16": True, "learning_rate": 2e-5, "max_source_length": 512}
DEEPSPEED = importlib.metadata.version("deepspeed")


def deepspeed_verdict(ds: Mapping[str, Any]) -> tuple[str | None, str] | None:
    verdict = check_schedule(ds)
    return (verdict.refusal, verdict.deepspeed) if verdict is not None else None


def test_the_pair_is_named_with_the_fix() -> None:
    _, found = diagnose(DS, ARGS, env={}, gpus=None, trainer="5.17.0", schedule=deepspeed_verdict)
    (finding,) = [f for f in found if f.code == "trainer-scheduler-refused"]
    assert finding.severity == "warn"
    assert finding.title == (
        f"transformers 5.17.0 with deepspeed {DEEPSPEED}: deepspeed.initialize refuses the WarmupLR scheduler your "
        "Trainer fills (ValueError: warmup_num_steps must be a positive integer, got 0)"
    )
    assert finding.fix.startswith(
        "set warmup_steps: 1 in your training args (what transformers >= 5.18 fills itself), or upgrade transformers "
        "to >= 5.18"
    )
    # a Trainer that clamps, or warmup in their args: nothing to say
    _, clean = diagnose(DS, ARGS, env={}, gpus=None, trainer="5.18.0", schedule=deepspeed_verdict)
    _, warm = diagnose(
        DS, {**ARGS, "warmup_steps": 10}, env={}, gpus=None, trainer="4.57.3", schedule=deepspeed_verdict
    )
    assert "trainer-scheduler-refused" not in {f.code for f in clean + warm}


TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "LOCAL_RANK", "RANK")}
    return subprocess.run([*TUNER, *args], capture_output=True, text=True, env={**env, "CUDA_VISIBLE_DEVICES": ""})


def test_doctor_cli_names_the_pair(tmp_path: Path) -> None:
    args = tmp_path / "args.json"
    args.write_text(json.dumps({**ARGS, "deepspeed": str(SEED / "ds_config.json")}))
    done = run("doctor", "--training-args", str(args), "--transformers-version", "4.57.3")
    assert done.returncode == 0, done.stderr
    assert f"transformers 4.57.3 with deepspeed {DEEPSPEED}: deepspeed.initialize refuses" in done.stdout
    assert "try: set warmup_steps: 1 in your training args" in done.stdout
    bad = run("doctor", "--training-args", str(args), "--transformers-version", "latest")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert (
        bad.stderr.strip()
        == "error: --transformers-version 'latest' is not a version; give your training host's, e.g. 4.46.3"
    )
