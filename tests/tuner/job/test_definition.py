"""tuner.job.definition: the user's job from its sources (defaults, baseline, flags), and the space fixed to it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.interop.baseline_files import load_baseline
from tuner.job.definition import Job, JobFlags, fix_space, resolve_job
from tuner.job.space import default_space, space_from_dict

SEED = Path(__file__).resolve().parents[2] / "data" / "seed"  # the motivating team's files, verbatim


def test_builtin_presets_have_defaults_and_a_real_model_needs_a_length() -> None:
    assert resolve_job(builtin=True) == Job(precision="fp32", max_length=128)
    with pytest.raises(ConfigError, match="--max-length") as err:
        resolve_job(builtin=False)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"space\.max_length"):
        resolve_job(builtin=False, length_hint="give space.max_length")
    assert resolve_job(builtin=False, flags=JobFlags(max_length=512)).max_length == 512


def test_the_motivating_teams_files_give_their_job() -> None:
    # their file has overwrite_output_dir (gone in transformers 5): read as the 4.x release they train on
    base = load_baseline(SEED / "training_args.json", world_size=4, max_length=1, transformers_version="4.57.3")
    job = resolve_job(builtin=False, baseline_knobs=base.knobs, hf_args=base.hf_args, flags=JobFlags(max_length=512))
    assert (job.precision, job.max_length) == ("bf16", 512)
    assert (job.eval_batch_size, job.generate, job.num_beams) == (50, True, 1)
    assert job.evaluates and "eval batch 50 + generate 512 tokens" in job.describe()


def test_training_args_lengths_and_generation_settings_then_flags_win(tmp_path: Path) -> None:
    args = {
        "output_dir": "o",
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 16,
        "eval_strategy": "epoch",
        "predict_with_generate": True,
        "max_source_length": 384,
        "max_target_length": 64,
        "generation_max_length": 96,
        "generation_num_beams": 4,
        "fp16": True,
    }
    (tmp_path / "args.json").write_text(json.dumps(args))
    base = load_baseline(tmp_path / "args.json", max_length=1)
    job = resolve_job(builtin=False, baseline_knobs=base.knobs, hf_args=base.hf_args)
    assert job == Job(
        precision="fp16",
        max_length=384,
        max_target_length=64,
        eval_batch_size=16,
        generate=True,
        generation_max_length=96,
        num_beams=4,
    )
    assert job.settings().label_length(job.max_length) == 64 and job.settings().generation_length(384) == 96
    later = resolve_job(
        builtin=False,
        baseline_knobs=base.knobs,
        hf_args=base.hf_args,
        flags=JobFlags(max_length=256, precision="bf16", generate=False, eval_batch_size=4),
    )
    assert (later.max_length, later.precision, later.generate, later.eval_batch_size) == (256, "bf16", False, 4)


def test_their_deepspeed_json_and_training_args_as_two_files_give_the_same_job(tmp_path: Path) -> None:
    args = {k: v for k, v in json.loads((SEED / "training_args.json").read_text()).items() if k != "deepspeed"}
    (tmp_path / "args.json").write_text(json.dumps(args))  # no "deepspeed" key: the JSON comes as its own file
    base = load_baseline(
        SEED / "ds_config.json", tmp_path / "args.json", world_size=4, max_length=1, transformers_version="4.57.3"
    )
    job = resolve_job(builtin=False, baseline_knobs=base.knobs, hf_args=base.hf_args, flags=JobFlags(max_length=512))
    assert (job.precision, job.eval_batch_size, job.generate) == ("bf16", 50, True)
    assert base.knobs["zero_stage"] == 2 and base.knobs["offload_optimizer"] and base.knobs["overlap_comm"]


def test_a_deepspeed_json_alone_fixes_its_precision_and_evaluates_nothing(tmp_path: Path) -> None:
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    base = load_baseline(tmp_path / "ds.json", world_size=1, max_length=128)
    job = resolve_job(builtin=True, baseline_knobs=base.knobs, hf_args=base.hf_args)
    assert (job.precision, job.max_length, job.evaluates) == ("bf16", 128, False)


def test_generate_without_an_eval_batch_uses_the_trainers_default() -> None:
    assert resolve_job(builtin=True, flags=JobFlags(generate=True)).eval_batch_size == 8


def test_invalid_flag_values_are_one_line() -> None:
    with pytest.raises(ConfigError, match="job settings") as err:
        resolve_job(builtin=True, flags=JobFlags(num_beams=0))
    assert "\n" not in str(err.value)


def test_fix_space_holds_the_job_and_reports_what_a_space_file_changes_on_purpose() -> None:
    job = Job(precision="bf16", max_length=512, eval_batch_size=50, generate=True)
    space, changed = fix_space(default_space(), job)
    assert (space.precision, space.max_length, space.eval_batch_size, space.generate) == (["bf16"], [512], [50], [True])
    assert changed == [] and space.zero_stage == default_space().zero_stage  # the knobs stay searched
    listed = space_from_dict(
        {**default_space().model_dump(mode="json"), "max_length": [256, 512], "eval_batch_size": [10, 50]}, "file"
    )
    space, changed = fix_space(listed, job, {"max_length", "eval_batch_size"})
    assert space.max_length == [256, 512] and space.eval_batch_size == [10, 50] and space.precision == ["bf16"]
    assert changed == ["max_length", "eval_batch_size"]
    same = space_from_dict({**default_space().model_dump(mode="json"), "precision": ["bf16"]}, "file")
    assert fix_space(same, job, {"precision"})[1] == []  # the file says what the job says: nothing changed
