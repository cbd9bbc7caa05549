"""The export is the user's own files with only the tuned knobs changed, and the DeepSpeed JSON the probes ran is the
one the Trainer runs from it ("probe JSON == export JSON"): checked with the motivating team's files as they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trials.contract import Knobs
from tuner.interop.baseline_files import load_baseline
from tuner.interop.export import UserFiles, deepspeed_export, hf_export, installed_transformers, render
from tuner.interop.export.changes import Change, changes_of, diff
from tuner.interop.export.own import checkpointing_key
from tuner.probing.config import probe_config

SEED = Path(__file__).resolve().parents[2] / "data" / "seed"  # the motivating team's files, verbatim
TUNED = {"micro_batch_size": 4, "zero_stage": 1, "reduce_bucket_size": 50_000_000, "overlap_comm": False}


def seed_case(tmp: Path | None = None, **tuned: Any) -> tuple[Any, Knobs, int]:
    """The team's files, read as the 4.x release they train on (their file has overwrite_output_dir, gone in
    transformers 5); with ``tmp``: as they would run on this host's release (overwrite_output_dir dropped)."""
    if tmp is None:
        base = load_baseline(
            SEED / "training_args.json", world_size=1, hidden_size=64, max_length=32, transformers_version="4.57.3"
        )
    else:
        given = json.loads((SEED / "training_args.json").read_text())
        given.pop("overwrite_output_dir")
        (tmp / "ds_config.json").write_text((SEED / "ds_config.json").read_text())
        (tmp / "training_args.json").write_text(json.dumps(given))
        base = load_baseline(tmp / "training_args.json", world_size=1, hidden_size=64, max_length=32)
    knobs = Knobs.model_validate({**base.knobs, **TUNED, "offload_optimizer": False, **tuned})
    accum = 8 // knobs.micro_batch_size  # a global batch of 8 on one rank
    return base, knobs, accum


def exports(base: Any, knobs: Knobs, accum: int) -> tuple[dict[str, Any], dict[str, Any]]:
    kw: dict[str, Any] = {
        "world_size": 1,
        "gradient_accumulation_steps": accum,
        "baseline": base.ds_config,
        "files": UserFiles.of(base.files()),
    }
    return deepspeed_export(knobs.model_dump(), **kw), hf_export(
        knobs.model_dump(), **kw, transformers_version=installed_transformers()
    )


def test_their_training_args_come_back_with_only_the_tuned_values_changed() -> None:
    base, knobs, accum = seed_case(gradient_checkpointing=True)
    ds, hf = exports(base, knobs, accum)
    given = json.loads((SEED / "training_args.json").read_text())
    key = checkpointing_key(installed_transformers())  # activation_checkpointing from transformers 5.23
    other = {"activation_checkpointing", "gradient_checkpointing"} - {key}
    tuned = {"per_device_train_batch_size", "gradient_accumulation_steps", key, "deepspeed"}
    assert {k: v for k, v in hf.items() if k not in tuned} == {k: v for k, v in given.items() if k not in tuned}
    assert (hf["per_device_train_batch_size"], hf["gradient_accumulation_steps"]) == (4, 2)
    assert hf[key] is True and not other & set(hf)
    assert hf["bf16"] is True and hf["predict_with_generate"] is True and hf["per_device_eval_batch_size"] == 50
    assert hf["deepspeed"] == ds
    # their DeepSpeed file: "auto" where they wrote it (the Trainer fills it from these args), tuned ZeRO keys set
    assert ds["train_micro_batch_size_per_gpu"] == ds["train_batch_size"] == ds["gradient_accumulation_steps"] == "auto"
    assert ds["bf16"] == {"enabled": "auto"} and ds["gradient_clipping"] == "auto"
    assert ds["optimizer"] == json.loads((SEED / "ds_config.json").read_text())["optimizer"]
    zero = ds["zero_optimization"]
    assert (zero["stage"], zero["reduce_bucket_size"], zero["overlap_comm"]) == (1, 50_000_000, False)
    assert zero["offload_optimizer"] == {"device": "none"} and zero["reduce_scatter"] is True  # their key, kept


def test_the_trainer_runs_the_deepspeed_json_the_probe_ran(tmp_path: Path) -> None:
    """The hf export through transformers' own HfTrainerDeepSpeedConfig resolves every "auto" to exactly the JSON
    the probe was given (tuner.probing.config.probe_config, before the probe's own run adaptations)."""
    import torch
    from transformers import HfArgumentParser, Seq2SeqTrainingArguments

    base, knobs, accum = seed_case(tmp_path)
    probed = probe_config(
        knobs=knobs, baseline=base.ds_config, training_args=base.hf_args, gradient_accumulation_steps=accum
    ).deepspeed
    _, hf = exports(base, knobs, accum)
    hf = {**hf, "output_dir": str(tmp_path), "report_to": [], "use_cpu": True}
    (args,) = HfArgumentParser(Seq2SeqTrainingArguments).parse_dict(hf, allow_extra_keys=True)
    args.hf_deepspeed_config.trainer_config_finalize(args, torch.nn.Linear(64, 64), num_training_steps=100)
    ran = json.loads(json.dumps(args.hf_deepspeed_config.config))
    assert probed is not None and ran.pop("steps_per_print") == float("inf")  # the Trainer's own logging switch
    assert probed.pop("steps_per_print") == 2000  # theirs (logging only; a probe silences it too)
    assert ran == json.loads(json.dumps(probed))


def test_a_deepspeed_only_user_gets_the_probed_json_itself() -> None:
    ds_only = json.loads((SEED / "ds_config.json").read_text())
    ds_only = {k: v for k, v in ds_only.items() if k not in ("optimizer", "scheduler", "bf16")}
    ds_only.update(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=4, train_batch_size=8)
    ds_only["gradient_clipping"] = 0.3
    ds_only["flops_profiler"] = {"enabled": True, "output_file": "prof.txt"}
    from tuner.interop.baseline import parse_baseline

    base = parse_baseline(ds_only, None, world_size=1, max_length=32)
    knobs = Knobs.model_validate({**base.knobs, **TUNED})
    probed = probe_config(knobs=knobs, baseline=base.ds_config, gradient_accumulation_steps=2).deepspeed
    text = render(
        "deepspeed",
        knobs.model_dump(),
        world_size=1,
        gradient_accumulation_steps=2,
        baseline=base.ds_config,
        files=UserFiles.of(base.files()),
    )
    assert json.loads(text) == probed
    assert probed is not None and probed["flops_profiler"]["output_file"] == "prof.txt"  # carried (listed, not probed)
    found = changes_of(
        UserFiles.of(base.files()),
        {"deepspeed": probed},
        job=None,
        baseline=None,
    )
    assert found.not_probed == ["flops_profiler"]
    assert "deepspeed: train_micro_batch_size_per_gpu: 2 -> 4" in found.lines()


def test_diff_lists_each_change_old_to_new() -> None:
    old = {"a": 1, "z": {"stage": 2, "x": True}, "gone": 3}
    new = {"a": 1, "z": {"stage": 1, "x": True, "y": 5}}
    assert [c.line() for c in diff(old, new, "deepspeed")] == [
        "deepspeed: z.stage: 2 -> 1",
        "deepspeed: z.y: (unset) -> 5",
        "deepspeed: gone: 3 -> (removed)",
    ]
    assert Change("knobs", "k", None, 2, added=True).line() == "knobs: k: (unset) -> 2"


@pytest.mark.parametrize(
    ("version", "key"),
    [
        ("5.24.0", "activation_checkpointing"),
        ("5.23.0", "activation_checkpointing"),
        ("5.22.1", "gradient_checkpointing"),  # 5.0-5.22 have no activation_checkpointing field (issue 23, defect 11)
        ("5.17.0", "gradient_checkpointing"),
        ("4.57.1", "gradient_checkpointing"),
        (None, "gradient_checkpointing"),
        ("main", "gradient_checkpointing"),
    ],
)
def test_checkpointing_is_named_as_the_installed_transformers_names_it(version: str | None, key: str) -> None:
    assert checkpointing_key(version) == key


def test_the_hf_export_carries_the_generation_the_eval_was_probed_with() -> None:
    """Flags override the training args (--generation-max-length, --num-beams): the export says what was probed."""
    job = {"generate": True, "generation_max_length": 24, "num_beams": 4}
    knobs = {"micro_batch_size": 2, "max_length": 32, "engine": "torch", "eval_batch_size": 8, "generate": True}
    plain = hf_export(knobs, world_size=1, gradient_accumulation_steps=1, job=job)
    assert (plain["generation_max_length"], plain["generation_num_beams"], plain["predict_with_generate"]) == (
        24,
        4,
        True,
    )
    base, _, _ = seed_case()
    own = hf_export(knobs, world_size=1, gradient_accumulation_steps=1, files=UserFiles.of(base.files()), job=job)
    assert own["generation_max_length"] == 24 and own["output_dir"] == "out"
    assert "generation_max_length" not in hf_export(knobs, world_size=1, gradient_accumulation_steps=1, job=None)


def test_best_changes_says_which_transformers_the_training_args_were_written_for() -> None:
    from dataclasses import dataclass, field

    from tuner.interop.export.changes import best_changes

    base, knobs, accum = seed_case(gradient_checkpointing=True)

    @dataclass
    class Best:
        knobs: dict[str, Any]
        config: dict[str, Any]
        fingerprints: list[dict[str, Any]] = field(default_factory=list)

    best = Best(knobs.model_dump(), {"world_size": 1, "gradient_accumulation_steps": accum})
    definition = {"baseline_files": base.files(), "baseline_source": base.ds_config}
    lines = best_changes(best, definition, None, "4.46.3").lines()
    assert "training args: gradient_checkpointing: (unset) -> True" in lines
    assert lines[-1].startswith(
        "training args written for transformers 4.46.3 (checkpointing as gradient_checkpointing)"
    )
    assert (
        best_changes(best, definition, None, "5.24.0")
        .lines()[-1]
        .startswith("training args written for transformers 5.24.0 (checkpointing as activation_checkpointing)")
    )


def test_a_truncation_the_search_chose_is_named_as_a_change_to_their_job_in_words() -> None:
    from dataclasses import dataclass, field

    from tuner.interop.export.changes import best_changes
    from tuner.job.definition import Job
    from tuner.job.objective import objective_for

    @dataclass
    class Best:
        knobs: dict[str, Any]
        config: dict[str, Any]
        fingerprints: list[dict[str, Any]] = field(default_factory=list)

    knobs = Knobs(micro_batch_size=2, max_length=64, engine="torch")
    best = Best(knobs.model_dump(), {"world_size": 1, "gradient_accumulation_steps": 1})
    objective = objective_for([64, 512], lengths=[10] * 98 + [300, 500], drawn=True)
    definition = {
        "job": Job(max_length=512, precision="fp32").model_dump(mode="json"),
        "job_changes": ["max_length"],
        "objective": objective.to_dict(),
    }
    held = [line for line in best_changes(best, definition, None).lines() if line.startswith("held fixed")]
    assert held and held[0].endswith(
        "(searched on purpose, as the space file lists: max_length); the pick's max_length 64 is a change to your "
        "job: on your data it truncates 2.0% of samples, 37.8% of tokens (inputs at 64)"
    )
