"""Baseline import: DeepSpeed JSON and/or training args -> knobs, "auto" resolution, and one-line errors."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from trials.contract import Knobs
from tuner.errors import BaselineError, ConfigError
from tuner.interop.baseline import Baseline, parse_baseline
from tuner.interop.baseline_files import load_baseline
from tuner.interop.export import render
from tuner.interop.export.mapping import HF_DEFAULTS, auto_paths
from tuner.job.space import default_space

# The team's setup from DESIGN.md: HF-style "auto" everywhere, ZeRO-2 with CPU offload, overlap_comm, 2e8 buckets.
HF_ZERO2 = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "allgather_partitions": True,
        "allgather_bucket_size": 2e8,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 2e8,
        "contiguous_gradients": True,
    },
}
HF_ARGS = {
    "output_dir": "out",
    "per_device_train_batch_size": 4,
    "per_device_eval_batch_size": 32,
    "gradient_accumulation_steps": 2,
    "bf16": True,
    "eval_strategy": "epoch",
    "predict_with_generate": True,
    "max_source_length": 512,
    "max_target_length": 128,
    "learning_rate": 1e-4,
    "max_steps": 1000,
    "warmup_steps": 50,
}
EXPLICIT = {
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 1},
    "bf16": {"enabled": True},
}


def with_(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    node = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    if value is _DEL:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return out


_DEL = object()


def test_the_teams_setup_maps_onto_the_knobs() -> None:
    b = parse_baseline(HF_ZERO2, HF_ARGS, world_size=4)
    assert b.knobs == {
        "micro_batch_size": 4,
        "max_length": 512,
        "engine": "deepspeed",
        "zero_stage": 2,
        "allgather_bucket_size": 200_000_000,
        "reduce_bucket_size": 200_000_000,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "offload_optimizer": True,
        "gradient_checkpointing": False,
        "precision": "bf16",
        "alloc_conf": None,
        "eval_batch_size": 32,
        "generate": True,
    }
    assert (b.world_size, b.gradient_accumulation_steps, b.global_batch) == (4, 2, 32)
    # every "auto" resolved the way the HF Trainer resolves it
    assert auto_paths(b.ds_config) == []
    assert b.ds_config["optimizer"]["params"] == {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    assert b.ds_config["scheduler"]["params"] == {
        "warmup_min_lr": 0,
        "warmup_max_lr": 1e-4,
        "warmup_num_steps": 50,
        "total_num_steps": 1000,
    }
    assert b.ds_config["gradient_clipping"] == 1.0 and b.ds_config["train_batch_size"] == 32
    assert HF_ZERO2["train_micro_batch_size_per_gpu"] == "auto"  # input untouched
    Knobs(**b.knobs)


def test_baseline_round_trips_and_exports_keep_its_optimizer() -> None:
    b = parse_baseline(HF_ZERO2, HF_ARGS, world_size=4)
    assert Baseline.from_dict(json.loads(json.dumps(b.to_dict()))) == b
    ds = json.loads(render("deepspeed", b.knobs, world_size=4, gradient_accumulation_steps=2, baseline=b.ds_config))
    assert ds["optimizer"] == b.ds_config["optimizer"] and ds["scheduler"] == b.ds_config["scheduler"]
    assert ds["train_batch_size"] == b.global_batch and auto_paths(ds) == []


@pytest.mark.parametrize(
    ("ds", "hf", "kw", "expect"),
    [
        # explicit DeepSpeed only: world size derived from train_batch_size
        (
            EXPLICIT,
            None,
            {"max_length": 256},
            {
                "micro_batch_size": 4,
                "zero_stage": 1,
                "precision": "bf16",
                "world": 4,
                "accum": 2,
                "global": 32,
                "max_length": 256,
            },
        ),
        # train_batch_size + micro: accumulation derived with the study's world size
        (
            with_(EXPLICIT, "gradient_accumulation_steps", _DEL),
            None,
            {"world_size": 2, "max_length": 64},
            {"accum": 4, "global": 32, "world": 2},
        ),
        # train_batch_size + accumulation: micro derived
        (
            with_(EXPLICIT, "train_micro_batch_size_per_gpu", _DEL),
            None,
            {"world_size": 8, "max_length": 64},
            {"micro_batch_size": 2, "accum": 2},
        ),
        # micro only: accumulation 1, global unknown without the world size
        ({"train_micro_batch_size_per_gpu": 3}, None, {"max_length": 64}, {"accum": 1, "global": None, "world": None}),
        # training args only: plain torch (DDP) baseline, HF defaults fill the rest
        (
            None,
            {"per_device_train_batch_size": 2, "max_seq_length": 128, "fp16": True},
            {},
            # no eval_strategy: TrainingArguments' "no", so no eval step (none invented at the default eval batch)
            {"engine": "torch", "zero_stage": 0, "precision": "fp16", "eval_batch_size": None, "accum": 1},
        ),
        # training args naming an inline DeepSpeed dict
        (None, {**HF_ARGS, "deepspeed": HF_ZERO2}, {"world_size": 4}, {"zero_stage": 2, "offload_optimizer": True}),
        # legacy spellings: cpu_offload, bfloat16; stage 3 overlaps by default
        (
            {
                "train_micro_batch_size_per_gpu": 1,
                "zero_optimization": {"stage": 3, "cpu_offload": True},
                "bfloat16": {"enabled": True},
            },
            None,
            {"max_length": 8},
            {"offload_optimizer": True, "precision": "bf16", "overlap_comm": True},
        ),
        # activation_checkpointing (transformers 5) and gradient_checkpointing both count
        (
            None,
            {"per_device_train_batch_size": 2, "max_length": 64, "activation_checkpointing": True},
            {},
            {"gradient_checkpointing": True},
        ),
        (
            None,
            {"per_device_train_batch_size": 2, "max_length": 64, "gradient_checkpointing": True},
            {},
            {"gradient_checkpointing": True},
        ),
        # "auto" buckets with the model's hidden size, as the Trainer fills them
        (
            with_(HF_ZERO2, "zero_optimization.reduce_bucket_size", "auto"),
            HF_ARGS,
            {"hidden_size": 1024},
            {"reduce_bucket_size": 1024 * 1024},
        ),
        # ... and without it: DeepSpeed's default (knob unset), noted
        (with_(HF_ZERO2, "zero_optimization.reduce_bucket_size", "auto"), HF_ARGS, {}, {"reduce_bucket_size": None}),
        # no length anywhere: the default space's max_length, so trial 0 and the trials share shapes
        (EXPLICIT, None, {}, {"max_length": max(default_space().max_length)}),
        # the length the training args name wins over the default given
        (
            EXPLICIT,
            {**HF_ARGS, "deepspeed": "ignored.json", "bf16": True, "per_device_train_batch_size": 4},
            {"max_length": 64},
            {"max_length": 512},
        ),
    ],
)
def test_parse_table(ds: dict | None, hf: dict | None, kw: dict, expect: dict) -> None:
    b = parse_baseline(ds, hf, **kw)
    got = {**b.knobs, "world": b.world_size, "accum": b.gradient_accumulation_steps, "global": b.global_batch}
    assert {k: got[k] for k in expect} == expect
    Knobs(**b.knobs)


@pytest.mark.parametrize(
    ("ds", "hf", "kw", "match"),
    [
        (None, None, {}, "needs a DeepSpeed config and/or"),
        ([1, 2], None, {}, "must be a JSON object"),
        (HF_ZERO2, None, {"max_length": 8}, r"'auto' values \(train_batch_size, train_micro_batch_size_per_gpu"),
        (with_(EXPLICIT, "train_batch_size", 33), None, {"max_length": 8}, "train_batch_size=33"),
        (EXPLICIT, None, {"world_size": 2, "max_length": 8}, r"train_batch_size=32 contradicts .* 4 x 2 x 2 = 16"),
        (with_(EXPLICIT, "train_micro_batch_size_per_gpu", _DEL), None, {"max_length": 8}, "needs the world size"),
        (
            with_(EXPLICIT, "gradient_accumulation_steps", _DEL),
            None,
            {"world_size": 3, "max_length": 8},
            "does not split",
        ),
        (
            with_(EXPLICIT, "zero_optimization.bucket_size", 5),
            None,
            {"max_length": 8},
            "unknown key zero_optimization.bucket_size",
        ),
        (
            with_(EXPLICIT, "zero_optimization.overlap_com", True),
            None,
            {"max_length": 8},
            "did you mean 'overlap_comm'",
        ),
        (with_(EXPLICIT, "zero_optimization.stage", 4), None, {"max_length": 8}, "stage must be 0, 1, 2 or 3, got 4"),
        (with_(EXPLICIT, "zero_optimization.stage", "auto"), None, {"max_length": 8}, "stage must be"),
        (with_(EXPLICIT, "zero_optimization", [1]), None, {"max_length": 8}, "zero_optimization must be an object"),
        ({**EXPLICIT, "zero_optimisation": {"stage": 2}}, None, {"max_length": 8}, "did you mean 'zero_optimization'"),
        (with_(EXPLICIT, "zero_optimization.offload_optimizer", {"device": "nvme"}), None, {"max_length": 8}, "nvme"),
        (
            with_(EXPLICIT, "zero_optimization.offload_optimizer", {"device": "gpu"}),
            None,
            {"max_length": 8},
            "device none, cpu or nvme",
        ),
        (
            with_(EXPLICIT, "zero_optimization.offload_param", {"device": "nvme"}),
            None,
            {"max_length": 8},
            "offload_param.device 'nvme'",
        ),
        (
            with_(EXPLICIT, "zero_optimization", {"stage": 0, "offload_optimizer": {"device": "cpu"}}),
            None,
            {"max_length": 8},
            "offload_optimizer needs zero_stage",
        ),
        (with_(EXPLICIT, "zero_optimization.reduce_bucket_size", -5), None, {"max_length": 8}, "reduce_bucket_size"),
        (with_(EXPLICIT, "zero_optimization.overlap_comm", "yes"), None, {"max_length": 8}, "overlap_comm must be"),
        (with_(EXPLICIT, "fp16", {"enabled": True}), None, {"max_length": 8}, "both true"),
        (with_(EXPLICIT, "train_micro_batch_size_per_gpu", 0), None, {"max_length": 8}, "integer >= 1"),
        (with_(EXPLICIT, "fp16", True), None, {"max_length": 8}, "fp16 must be an object"),
        ({"gradient_clipping": 1.0}, None, {"max_length": 8}, "no batch size"),
        (
            EXPLICIT,
            {"per_device_train_batch_size": 8, "max_length": 8},
            {},
            r"contradicts training args "
            r"per_device_train_batch_size=8",
        ),
        (
            EXPLICIT,
            {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "max_length": 8},
            {},
            r"bf16.enabled=True contradicts training args bf16=False \(its default\)",
        ),
        (None, {"per_device_train_batch_size": "4", "max_length": 8}, {}, "per_device_train_batch_size must be"),
        (None, {"per_device_train_batch_size": 4, "max_length": 8, "bf16": True, "fp16": True}, {}, "both true"),
        (None, {"per_device_train_batch_size": 4, "max_length": 0}, {}, "max length must be an integer"),
        (
            None,
            {"per_device_train_batch_size": 4, "max_length": 8, "do_eval": True, "predict_with_generate": "yes"},
            {},
            "predict_with_generate must be true or false",
        ),
        (None, {"deepspeed": "ds.json", "max_length": 8}, {}, "pass that file as the DeepSpeed config"),
    ],
)
def test_errors_name_the_field(ds: Any, hf: Any, kw: dict, match: str) -> None:
    with pytest.raises(BaselineError, match=match) as info:
        parse_baseline(ds, hf, **kw)
    assert "\n" not in str(info.value)


def test_unresolvable_auto_is_kept_for_the_trainer_and_refused_by_the_deepspeed_export() -> None:
    hf = {k: v for k, v in HF_ARGS.items() if k != "max_steps"}
    b = parse_baseline(HF_ZERO2, hf, world_size=4)
    assert auto_paths(b.ds_config) == ["scheduler.params.total_num_steps"]
    assert any("total_num_steps: stays 'auto'" in n for n in b.notes)
    with pytest.raises(ConfigError, match="total_num_steps"):
        render("deepspeed", b.knobs, world_size=4, gradient_accumulation_steps=2, baseline=b.ds_config)
    assert json.loads(render("hf", b.knobs, world_size=4, gradient_accumulation_steps=2, baseline=b.ds_config))


def write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_load_files(tmp_path: Path) -> None:
    ds = write(tmp_path / "ds.json", HF_ZERO2)
    hf = write(tmp_path / "args.json", HF_ARGS)
    assert load_baseline(ds, hf, world_size=4).knobs["zero_stage"] == 2
    # a training-args file naming its DeepSpeed file, relative to itself
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "ds.json", HF_ZERO2)
    args = write(tmp_path / "sub" / "args.json", {**HF_ARGS, "deepspeed": "ds.json"})
    assert load_baseline(args, world_size=4).knobs["offload_optimizer"] is True
    assert load_baseline(write(tmp_path / "e.json", EXPLICIT), max_length=9).world_size == 4


@pytest.mark.parametrize(
    ("content", "second", "match"),
    [
        ("{not json", None, r"not valid JSON: .* line 1 column 2"),
        ("[1]", None, "must hold a JSON object"),
        ({"foo": 1}, None, "cannot tell whether"),
        (HF_ARGS, HF_ARGS, "two training-args files"),
        (None, None, "cannot read the baseline file"),
        ({**HF_ARGS, "deepspeed": "missing.json"}, None, "cannot read the DeepSpeed config"),
    ],
)
def test_load_errors(tmp_path: Path, content: Any, second: Any, match: str) -> None:
    path = tmp_path / "b.json" if content is None else write(tmp_path / "b.json", content)
    other = None if second is None else write(tmp_path / "o.json", second)
    with pytest.raises(BaselineError, match=match):
        load_baseline(path, other)


def test_hf_defaults_match_the_installed_transformers() -> None:
    from transformers import Seq2SeqTrainingArguments

    defaults = {f.name: f.default for f in dataclasses.fields(Seq2SeqTrainingArguments)}
    assert {k: defaults[k] for k in HF_DEFAULTS} == HF_DEFAULTS
