"""Issue 39's DPO recipe through the commands a user types, on builtin:tiny-llama: `tuner estimate` of a DPO recipe
prints a higher peak than the same file as SFT, with the frozen reference model's part and the pairs' rows; trial 0 of
a real `tuner search` measures that peak (the pairs and the reference model), within the estimate's accuracy; a PEFT
DPO recipe (use_peft) holds no second model: its reference is the adapter disabled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TUNER = str(Path(sys.executable).with_name("tuner"))
BASE: dict[str, Any] = {"output_dir": "out", "per_device_train_batch_size": 2, "max_length": 64, "report_to": "none"}
SFT = {**BASE, "dataset_text_field": "text"}  # SFTConfig-only key: the same file read as an SFT recipe
DPO = {**BASE, "beta": 0.1}  # DPOConfig-only key: a DPO recipe
PEFT = {"use_peft": True, "lora_target_modules": ["q_proj", "v_proj"]}
REFERENCE_BYTES = 494_848  # builtin:tiny-llama's 123,712 parameters in fp32 (the plain torch engine's reference)
# the search's one config: the recipe's own (TRL's defaults: bf16, gradient checkpointing) at its micro batch
SPACE = "micro_batch_size: [2]\ngradient_checkpointing: [true]\n"


def tuner(tmp: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "COLUMNS": "200"}
    return subprocess.run([TUNER, *argv], capture_output=True, text=True, timeout=600, cwd=tmp, env=env, check=False)


def estimated(tmp: Path, name: str, args: dict[str, Any]) -> dict[str, Any]:
    (tmp / f"{name}.json").write_text(json.dumps(args))
    done = tuner(tmp, "estimate", "--model", "builtin:tiny-llama", "--baseline", str(tmp / f"{name}.json"), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout))


def parts(estimate: dict[str, Any]) -> dict[str, int]:
    phase = next(p for p in estimate["ranks"][0]["phases"] if p["phase"] == "forward_backward")
    return {part["name"]: part["bytes"] for part in phase["parts"]}


def trial0_peak(tmp: Path, name: str, args: dict[str, Any]) -> int:
    (tmp / f"{name}.json").write_text(json.dumps(args))
    (tmp / "space.yaml").write_text(SPACE)
    url = f"sqlite:///{tmp / 'tuner.db'}"
    done = tuner(
        tmp, "search", "--model", "builtin:tiny-llama", "--baseline", str(tmp / f"{name}.json"), "--space",
        str(tmp / "space.yaml"), "--budget", "90s", "--n-trials", "1", "--finalists", "0", "--storage", url,
        "--study", name, "--seed", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    listed = tuner(tmp, "trials", "--storage", url, "--study", name, "--json").stdout
    first = next(r for r in map(json.loads, filter(str.strip, listed.split("\n"))) if r.get("trial") == 0)
    assert first["status"] == "ok" and first["knobs"]["gradient_checkpointing"], first
    return int(first["peak"])


def test_the_estimate_of_a_dpo_recipe_is_above_the_same_file_as_sft_by_the_reference_and_the_pairs(
    tmp_path: Path,
) -> None:
    sft, dpo = estimated(tmp_path, "sft", SFT), estimated(tmp_path, "dpo", DPO)
    assert dpo["raw"] > sft["raw"]
    said = parts(dpo)
    assert said["reference model"] == REFERENCE_BYTES and "reference model" not in parts(sft)
    assert said["activations + temporaries"] > parts(sft)["activations + temporaries"]  # 2 x micro rows
    text = tuner(tmp_path, "estimate", "--model", "builtin:tiny-llama", "--baseline", str(tmp_path / "dpo.json"))
    assert "reference model: DPO's frozen reference model, fp32, whole on every rank" in text.stdout
    assert "DPO's pairs: 2 x micro rows (chosen + rejected)" in text.stdout
    peft = estimated(tmp_path, "peft-dpo", {**DPO, **PEFT})
    assert "reference model" not in parts(peft)  # the adapter disabled is the reference: no second model


@pytest.mark.slow
def test_trial_0_of_a_dpo_recipe_measures_the_pairs_and_the_reference_and_peft_holds_no_second_model(
    tmp_path: Path,
) -> None:
    sft, dpo = trial0_peak(tmp_path, "sft", SFT), trial0_peak(tmp_path, "dpo", DPO)
    est_sft, est_dpo = estimated(tmp_path, "sft", SFT)["raw"], estimated(tmp_path, "dpo", DPO)["raw"]
    assert dpo > sft + REFERENCE_BYTES  # the reference model's parameters and the pairs' rows
    accuracy = 0.05  # the estimate's accuracy on the emulated device (its trace and the probe agree to bytes here)
    assert abs(dpo - est_dpo) <= accuracy * dpo
    assert abs((dpo - sft) - (est_dpo - est_sft)) <= accuracy * dpo  # above SFT by what the estimate says
    peft = trial0_peak(tmp_path, "peft-dpo", {**DPO, **PEFT})
    est_peft = estimated(tmp_path, "peft-dpo", {**DPO, **PEFT})["raw"]  # no reference part (above)
    assert abs(peft - est_peft) < REFERENCE_BYTES / 2  # a second model held would put it a whole copy above
