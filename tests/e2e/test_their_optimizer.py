"""Issue 38's adafactor pair through `tuner search` and `tuner best`: the same training args with and without
`optim: adafactor`, searched on builtin:tiny-llama. Trial 0 of the Adafactor file measures Adafactor's state (its peak
below the AdamW file's by about AdamW's 8 bytes per parameter), `tuner best --format hf` hands back the optimizer
that was probed, and `--changes` says it was held."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TUNER = str(Path(sys.executable).with_name("tuner"))
ARGS: dict[str, Any] = {
    "output_dir": "out",
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2,
    "max_seq_length": 64,
    "report_to": "none",
}
SPACE = "micro_batch_size: [4]\ngradient_checkpointing: [false]\n"


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([TUNER, *args], capture_output=True, text=True, timeout=600, env=env, check=False)


def searched(tmp: Path, name: str, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (tmp / f"{name}.json").write_text(json.dumps(args))
    (tmp / "space.yaml").write_text(SPACE)
    url = f"sqlite:///{tmp / 'tuner.db'}"
    done = tuner(
        "search", "--model", "builtin:tiny-llama", "--baseline", str(tmp / f"{name}.json"), "--space",
        str(tmp / "space.yaml"), "--budget", "90s", "--n-trials", "1", "--finalists", "0", "--no-estimate",
        "--storage", url, "--study", name, "--seed", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [
        json.loads(line)
        for line in tuner("trials", "--storage", url, "--study", name, "--json").stdout.split("\n")
        if line.strip()
    ]
    first = next(r for r in rows if r.get("trial") == 0)
    return url, first


@pytest.mark.slow
def test_the_adafactor_file_probes_adafactor_and_hands_it_back(tmp_path: Path) -> None:
    adamw_url, adamw = searched(tmp_path, "adamw", ARGS)
    adafactor_url, adafactor = searched(tmp_path, "adafactor", {**ARGS, "optim": "adafactor"})
    assert adamw["status"] == adafactor["status"] == "ok"
    params = 124_000  # builtin:tiny-llama: about this many parameters (AdamW: m and v, 8 bytes each)
    assert adamw["peak"] - adafactor["peak"] > 4 * params
    hf = json.loads(tuner("best", "--storage", adafactor_url, "--study", "adafactor", "--format", "hf").stdout)
    assert hf["optim"] == "adafactor"
    changes = tuner("best", "--storage", adafactor_url, "--study", "adafactor", "--changes").stdout
    assert "optimizer adafactor (args: optim)" in changes  # held fixed: the job line names the probed optimizer
    assert "optimizer adafactor" not in tuner("best", "--storage", adamw_url, "--study", "adamw", "--changes").stdout
