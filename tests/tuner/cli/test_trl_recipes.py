"""TRL recipes through the commands a user types (tuner.job.ledger.trl): an SFT recipe is said to be one, runs its
ModelConfig LoRA and TRL's changed defaults, its wrapped packing (rows of max_length: tuner.job.packing) and its
completion-only / assistant-only loss, BFD packing (TRL's default) and padding_free as padding-free rows; a DPO recipe
is read as DPO with its reference (a frozen model, the PEFT adapter disabled, or precomputed); padding_free without
packing and with a max_length (TRL raises on it) is refused in one line, exit 2; `tuner doctor` no longer calls a
recipe's keys invalid training args."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SFT: dict[str, Any] = {
    "output_dir": "out",
    "per_device_train_batch_size": 2,
    "max_length": 64,
    "dataset_text_field": "text",
    "packing": False,
    "use_peft": True,
    "lora_r": 8,
    "lora_target_modules": ["q_proj", "v_proj"],
}
DPO: dict[str, Any] = {"output_dir": "out", "per_device_train_batch_size": 2, "max_length": 64, "beta": 0.1}


def tuner(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("tuner")
    env_free = {"CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [str(exe), *argv], capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, **env_free}
    )


def dry_run(tmp_path: Path, args: dict[str, Any], *more: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(args))
    storage = f"sqlite:///{tmp_path / 'trl.db'}"
    return tuner(
        tmp_path, "search", "--model", "builtin:tiny-llama", "--baseline", str(path), "--budget", "2m", "--storage",
        storage, "--dry-run", *more,
    )  # fmt: skip


def test_an_sft_recipe_with_use_peft_runs_lora_with_trls_defaults_and_says_so(tmp_path: Path) -> None:
    done = dry_run(tmp_path, SFT)
    assert done.returncode == 0, done.stderr
    job = done.stdout
    assert "LoRA r 8 alpha 32 on q_proj,v_proj, dropout 0.05" in job  # lora_alpha / lora_dropout: ModelConfig's
    assert "SFT recipe (SFTConfig-only keys: dataset_text_field, packing)" in job
    assert "TRL 1.16.0 SFTConfig's defaults:" in job and "gradient_checkpointing true" in job
    assert "precision bf16 (TRL 1.16.0 SFTConfig's default: bf16 where fp16 is not set)" in job
    unset = dry_run(tmp_path, {key: value for key, value in SFT.items() if key != "max_length"})
    assert unset.returncode == 0, unset.stderr
    assert "length 1024 (TRL 1.16.0 SFTConfig's default max_length" in unset.stdout  # where TRL truncates
    plain = dry_run(tmp_path, {"output_dir": "out", "per_device_train_batch_size": 2, "max_length": 64})
    assert plain.returncode == 0, plain.stderr
    assert "recipe" not in plain.stdout and "LoRA" not in plain.stdout and "precision fp32" in plain.stdout


def test_bfd_packing_and_padding_free_run_padding_free_and_padding_free_with_a_max_length_is_refused(
    tmp_path: Path,
) -> None:
    flat = "padding-free: each micro batch one row of micro x max_length tokens, position_ids restarting at each"
    for given in (
        {"packing": True},
        {"packing": True, "packing_strategy": "bfd_split"},
        {"packing": True, "packing_strategy": "wrapped", "padding_free": True},
        {"padding_free": True, "max_length": None},  # TRL's condition: the samples untruncated (--max-length here)
    ):
        done = dry_run(tmp_path, {**SFT, **given}, "--max-length", "64")
        assert done.returncode == 0, (given, done.stderr)
        said = " ".join(done.stdout.split())
        assert flat in said and "padding-free (each micro batch one row of micro x length tokens)" in said, said
    bfd = " ".join(dry_run(tmp_path, {**SFT, "packing": True}).stdout.split())
    assert "packing bfd: rows of up to max_length tokens, best fit (the worst batch: full rows)" in bfd
    evaluated = dry_run(tmp_path, {**SFT, "eval_packing": True})  # eval rows packed, padded: not padding-free
    assert evaluated.returncode == 0 and "padding-free" not in evaluated.stdout, evaluated.stderr
    done = dry_run(tmp_path, {**SFT, "padding_free": True})
    said = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(said) == 1 and "padding_free without packing and with a max_length" in said[0]
    assert "set max_length: null" in said[0], done.stderr


def test_wrapped_packing_and_masked_losses_run_and_the_job_says_so(tmp_path: Path) -> None:
    packed = dry_run(tmp_path, {**SFT, "packing": True, "packing_strategy": "wrapped"})
    assert packed.returncode == 0, packed.stderr
    assert "packing wrapped: every row max_length tokens (the worst batch is every batch)" in packed.stdout
    assert "packing wrapped" not in dry_run(tmp_path, SFT).stdout
    path = tmp_path / "packed.json"
    path.write_text(json.dumps({**SFT, "packing": True, "packing_strategy": "wrapped"}))
    estimate = tuner(tmp_path, "estimate", "--model", "builtin:tiny-llama", "--baseline", str(path))
    assert estimate.returncode == 0, estimate.stderr
    said = " ".join(estimate.stdout.split())  # the table's console wraps lines
    assert "config from your baseline (your recipe's packing wrapped: every row max_length tokens" in said
    for loss in ({"completion_only_loss": True}, {"assistant_only_loss": True}):  # labels masked: the same shapes
        done = dry_run(tmp_path, {**SFT, **loss})
        assert done.returncode == 0, done.stderr


def test_a_dpo_recipe_is_read_as_dpo_with_its_reference(tmp_path: Path) -> None:
    done = dry_run(tmp_path, DPO)
    assert done.returncode == 0, done.stderr
    assert "DPO recipe (DPOConfig-only keys: beta)" in done.stdout
    assert "reference: a frozen copy of the model" in done.stdout
    assert "DPO pairs (chosen + rejected: 2 x micro rows), a frozen reference model" in done.stdout
    peft = dry_run(tmp_path, {**DPO, "use_peft": True, "lora_target_modules": ["q_proj", "v_proj"]})
    assert peft.returncode == 0, peft.stderr
    assert "the reference is the model with its adapter disabled (no second model)" in peft.stdout
    pre = dry_run(tmp_path, {**DPO, "precompute_ref_log_probs": True})
    assert pre.returncode == 0, pre.stderr
    assert "precomputed reference log-probs (no reference forward)" in pre.stdout
    synced = dry_run(tmp_path, {**DPO, "sync_ref_model": True})
    said = synced.stderr.strip().splitlines()
    assert synced.returncode == 2 and len(said) == 1 and "reference-model sync" in said[0], synced.stderr


def test_doctor_reads_a_recipe_through_the_same_ledger(tmp_path: Path) -> None:
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(SFT))
    done = tuner(tmp_path, "doctor", "--training-args", str(path), "--json")
    codes = {f["code"] for f in json.loads(done.stdout)["findings"]}
    assert "unknown-training-args" not in codes and "training-args-refused" not in codes, done.stdout
    path.write_text(json.dumps({**SFT, "padding_free": True}))
    found = json.loads(tuner(tmp_path, "doctor", "--training-args", str(path), "--json").stdout)["findings"]
    refused = [f for f in found if f["code"] == "training-args-refused"]
    assert "unknown-training-args" not in {f["code"] for f in found}
    assert len(refused) == 1 and "padding_free without packing" in refused[0]["why"]  # max_length: TRL's 64


def test_a_recipes_model_must_be_the_one_probed(tmp_path: Path) -> None:
    done = dry_run(tmp_path, {**SFT, "model_name_or_path": "builtin:tiny-t5"})
    assert done.returncode == 2
    said = done.stderr.strip().splitlines()
    assert len(said) == 1 and "model_name_or_path 'builtin:tiny-t5'" in said[0], done.stderr
    assert "pass --model builtin:tiny-t5" in said[0]
    same = dry_run(tmp_path, {**SFT, "model_name_or_path": "builtin:tiny-llama"})
    assert same.returncode == 0, same.stderr


def test_tuner_estimate_reads_a_recipe_as_the_search_does(tmp_path: Path) -> None:
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({key: value for key, value in SFT.items() if key != "max_length"}))
    done = tuner(tmp_path, "estimate", "--model", "builtin:tiny-llama", "--baseline", str(path))
    assert done.returncode == 0, done.stderr
    assert "bf16, length 1024" in done.stdout and "LoRA r 8 alpha 32" in done.stdout  # TRL's defaults, its LoRA
    path.write_text(json.dumps({**SFT, "model_name_or_path": "builtin:tiny-t5"}))
    other = tuner(tmp_path, "estimate", "--model", "builtin:tiny-llama", "--baseline", str(path))
    assert other.returncode == 2 and "model_name_or_path 'builtin:tiny-t5'" in other.stderr


def test_a_recipes_model_is_the_model_where_none_is_named(tmp_path: Path) -> None:
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({**SFT, "model_name_or_path": "builtin:tiny-llama"}))
    storage = f"sqlite:///{tmp_path / 'trl.db'}"
    done = tuner(tmp_path, "search", "--baseline", str(path), "--budget", "2m", "--storage", storage, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "builtin:tiny-llama" in done.stdout and "builtin:tiny-t5" not in done.stdout  # theirs, not the default
    plain = {"output_dir": "out", "per_device_train_batch_size": 2, "model_name_or_path": "builtin:tiny-llama"}
    path.write_text(json.dumps(plain))
    unnamed = tuner(tmp_path, "search", "--baseline", str(path), "--budget", "2m", "--storage", storage, "--dry-run")
    assert unnamed.returncode == 2 and "pass --model with your files" in unnamed.stderr  # not a recipe: their script's
    path.write_text(json.dumps({**SFT, "model_name_or_path": "builtin:tiny-llama"}))
    estimated = tuner(tmp_path, "estimate", "--baseline", str(path))
    assert estimated.returncode == 0 and "LoRA r 8" in estimated.stdout, estimated.stderr
    bare = tuner(tmp_path, "estimate", "--micro-batch-size", "2")
    assert bare.returncode == 2 and "pass --model" in bare.stderr and len(bare.stderr.strip().splitlines()) == 1


def test_doctor_prices_a_dpo_recipes_reference_model_and_names_precompute(tmp_path: Path) -> None:
    path = tmp_path / "dpo.json"
    path.write_text(json.dumps(DPO))
    done = tuner(tmp_path, "doctor", "--training-args", str(path), "--model", "builtin:tiny-llama", "--json")
    found = {f["code"]: f for f in json.loads(done.stdout)["findings"]}
    ref = found["dpo-reference-model"]
    estimate = tuner(tmp_path, "estimate", "--model", "builtin:tiny-llama", "--baseline", str(path), "--json")
    phases = [ph for rank in json.loads(estimate.stdout)["ranks"] for ph in rank["phases"]]
    rows = [part["bytes"] for ph in phases for part in ph["parts"] if part["name"] == "reference model"]
    assert ref["nbytes"] and ref["nbytes"] == max(rows)  # the estimate's own row
    assert "precompute_ref_log_probs: true" in ref["fix"]
    for other in ({"precompute_ref_log_probs": True}, {"use_peft": True, "lora_target_modules": ["q_proj"]}):
        path.write_text(json.dumps({**DPO, **other}))
        again = json.loads(tuner(tmp_path, "doctor", "--training-args", str(path), "--json").stdout)["findings"]
        assert "dpo-reference-model" not in {f["code"] for f in again}, other


def test_explain_of_a_dpo_oom_names_the_reference_models_and_the_pairs_share(tmp_path: Path) -> None:
    path = tmp_path / "dpo.json"
    path.write_text(json.dumps(DPO))
    storage = f"sqlite:///{tmp_path / 'x.db'}"
    args = ("--model", "builtin:tiny-llama", "--baseline", str(path), "--device-memory", "3MiB", "--storage", storage)
    done = tuner(tmp_path, "explain", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ref" in done.stdout.split("peak by phase and part")[1].splitlines()[0]  # the reference model's column
    assert "DPO in the train forward + backward: the reference model " in done.stdout
    assert "the pairs' activations " in done.stdout and "(2 x micro rows: chosen + rejected)" in done.stdout
