"""Export mapping, batch arithmetic and formats: pure functions, milliseconds, no torch."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass

import pytest
import yaml

from tuner.errors import ConfigError, TunerError
from tuner.interop.export import (
    FORMATS,
    ExportArgs,
    UserFiles,
    best_export_args,
    installed_transformers,
    measured_knobs,
    render,
    render_best,
    to_accelerate,
    to_deepspeed,
    to_env,
    to_hf,
)
from tuner.interop.export.mapping import AUTO, DS_FIELDS, auto_paths, get_path

BASE = {"micro_batch_size": 4, "max_length": 128}
USER_DS = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": 0.5,
    "steps_per_print": 50,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 100}},
    "fp16": {"enabled": True, "loss_scale_window": 500, "initial_scale_power": 12},
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": True,
        "reduce_bucket_size": 2e8,
        "allgather_bucket_size": 2e8,
        "offload_optimizer": {"device": "cpu", "pin_memory": False},
        "round_robin_gradients": True,
    },
}


def knobs(**kw: object) -> dict[str, object]:
    return {**BASE, **kw}


@pytest.mark.parametrize(("micro", "accum", "world"), [(1, 1, 1), (4, 2, 1), (2, 8, 4), (3, 5, 7)])
def test_batch_fields_multiply(micro: int, accum: int, world: int) -> None:
    ds = to_deepspeed(knobs(micro_batch_size=micro), world_size=world, gradient_accumulation_steps=accum)
    assert ds["train_micro_batch_size_per_gpu"] == micro
    assert ds["gradient_accumulation_steps"] == accum
    assert ds["train_batch_size"] == micro * accum * world


def test_every_mapped_knob_lands_on_its_path() -> None:
    k = knobs(
        zero_stage=2,
        allgather_bucket_size=123,
        reduce_bucket_size=456,
        overlap_comm=True,
        contiguous_gradients=False,
        offload_optimizer=True,
    )
    ds = to_deepspeed(k, world_size=1, gradient_accumulation_steps=1)
    for field in DS_FIELDS:
        if field.min_stage > k["zero_stage"]:  # ZeRO++ (stage 3): tests/tuner/interop/test_node_exports.py
            continue
        value = get_path(ds, field.path)
        if field.knob == "offload_optimizer":
            assert value["device"] == "cpu"
        else:
            assert value == k[field.knob], field.dotted


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_unset_buckets_are_deepspeed_default_and_offload_off_is_device_none(stage: int) -> None:
    ds = to_deepspeed(knobs(zero_stage=stage), world_size=2, gradient_accumulation_steps=1)
    zero = ds["zero_optimization"]
    assert zero["stage"] == stage
    assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 500_000_000
    assert zero["offload_optimizer"] == {"device": "none"}


def test_stage_zero_writes_no_zero_knobs() -> None:
    ds = to_deepspeed(knobs(engine="torch"), world_size=2, gradient_accumulation_steps=3)
    assert ds["zero_optimization"] == {"stage": 0}


@pytest.mark.parametrize(
    ("precision", "bf16", "fp16"), [("fp32", False, False), ("bf16", True, False), ("fp16", False, True)]
)
def test_precision_blocks(precision: str, bf16: bool, fp16: bool) -> None:
    ds = to_deepspeed(knobs(precision=precision), world_size=1, gradient_accumulation_steps=1)
    assert ds["bf16"]["enabled"] is bf16
    assert ds["fp16"]["enabled"] is fp16


def test_baseline_sections_kept_and_tuned_keys_replaced() -> None:
    k = knobs(zero_stage=1, reduce_bucket_size=50_000_000, overlap_comm=False, precision="fp16")
    ds = to_deepspeed(k, world_size=4, gradient_accumulation_steps=2, baseline=USER_DS)
    assert ds["optimizer"] == USER_DS["optimizer"]
    assert ds["scheduler"] == USER_DS["scheduler"]
    assert ds["gradient_clipping"] == 0.5
    assert ds["steps_per_print"] == 50
    assert ds["fp16"] == {"enabled": True, "loss_scale_window": 500, "initial_scale_power": 12}
    zero = ds["zero_optimization"]
    assert zero["stage"] == 1 and zero["reduce_bucket_size"] == 50_000_000 and zero["overlap_comm"] is False
    assert zero["round_robin_gradients"] is True  # an untuned ZeRO key of the user's stays
    assert zero["offload_optimizer"] == {"device": "none"}
    assert ds["train_batch_size"] == 4 * 2 * 4
    assert auto_paths(ds) == []
    assert USER_DS["train_batch_size"] == AUTO  # the caller's dict is not modified


def test_baseline_offload_options_kept_when_offload_stays_on() -> None:
    ds = to_deepspeed(
        knobs(zero_stage=2, offload_optimizer=True),
        world_size=1,
        gradient_accumulation_steps=1,
        baseline={"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}},
    )
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "ratio": 0.5, "pin_memory": True}
    ds = to_deepspeed(
        knobs(zero_stage=1, offload_optimizer=True), world_size=1, gradient_accumulation_steps=1, baseline=USER_DS
    )
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": False}  # the user's pin


def test_precision_switch_drops_the_other_blocks_options() -> None:
    ds = to_deepspeed(knobs(precision="bf16"), world_size=1, gradient_accumulation_steps=1, baseline=USER_DS)
    assert ds["fp16"] == {"enabled": False}
    assert ds["bf16"] == {"enabled": True}


def test_leftover_auto_is_refused_in_deepspeed_format_and_kept_for_hf() -> None:
    base = {"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 10}}}
    with pytest.raises(ConfigError, match=r"scheduler\.params\.total_num_steps"):
        to_deepspeed(knobs(), world_size=1, gradient_accumulation_steps=1, baseline=base)
    hf = to_hf(knobs(zero_stage=1), world_size=1, gradient_accumulation_steps=1, baseline=base)
    assert hf["deepspeed"]["scheduler"]["params"]["total_num_steps"] == AUTO


def test_hf_kwargs_are_the_single_source_of_truth() -> None:
    k = knobs(zero_stage=2, precision="fp16", gradient_checkpointing=True, eval_batch_size=2, generate=True)
    hf = to_hf(k, world_size=4, gradient_accumulation_steps=3, baseline=USER_DS)
    assert hf["per_device_train_batch_size"] == 4 and hf["gradient_accumulation_steps"] == 3
    assert hf["fp16"] is True and hf["bf16"] is False and hf["gradient_checkpointing"] is True
    assert hf["per_device_eval_batch_size"] == 2 and hf["predict_with_generate"] is True
    # explicit optimizer/clipping values move into kwargs; the DeepSpeed section says "auto" there
    assert hf["learning_rate"] == 3e-4 and (hf["adam_beta1"], hf["adam_beta2"]) == (0.9, 0.95)
    assert hf["weight_decay"] == 0.01 and hf["max_grad_norm"] == 0.5 and hf["adam_epsilon"] == 1e-8
    ds = hf["deepspeed"]
    assert {p for p in auto_paths(ds)} >= {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
        "bf16.enabled",
        "fp16.enabled",
        "optimizer.params.lr",
        "optimizer.params.betas",
        "scheduler.params.warmup_max_lr",
    }
    assert ds["zero_optimization"]["stage"] == 2 and ds["fp16"]["loss_scale_window"] == 500


def test_hf_without_deepspeed_engine_and_default_eval_batch() -> None:
    hf = to_hf(knobs(engine="torch", micro_batch_size=2), world_size=2, gradient_accumulation_steps=1)
    assert "deepspeed" not in hf and "predict_with_generate" not in hf
    assert hf["per_device_eval_batch_size"] == 2  # never the Trainer's default 8 behind the user's back


def test_accelerate_points_at_the_deepspeed_json() -> None:
    acc = to_accelerate(knobs(zero_stage=3, precision="bf16"), world_size=8, gradient_accumulation_steps=1)
    assert acc["distributed_type"] == "DEEPSPEED" and acc["num_processes"] == 8
    assert "mixed_precision" not in acc  # accelerate refuses it next to a deepspeed_config_file
    assert acc["deepspeed_config"]["deepspeed_config_file"] == "ds_config.json"
    assert acc["deepspeed_config"]["zero3_init_flag"] is True
    plain = to_accelerate(knobs(engine="torch"), world_size=2, gradient_accumulation_steps=1)
    assert plain["distributed_type"] == "MULTI_GPU" and "deepspeed_config" not in plain
    assert plain["mixed_precision"] == "no"
    assert (
        yaml.safe_load(render("accelerate", knobs(), world_size=1, gradient_accumulation_steps=1))["num_processes"] == 1
    )


def test_env_export_and_its_shell_form() -> None:
    k = knobs(alloc_conf="expandable_segments:True,max_split_size_mb:128", precision="bf16")
    env = to_env(k, world_size=2, gradient_accumulation_steps=4)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == env["PYTORCH_ALLOC_CONF"] == k["alloc_conf"]
    assert env["TUNER_GLOBAL_BATCH"] == "32" and env["TUNER_MAX_LENGTH"] == "128"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in to_env(knobs(), world_size=1, gradient_accumulation_steps=1)
    text = render("env", k, world_size=2, gradient_accumulation_steps=4)
    out = subprocess.run(
        ["sh", "-c", text + 'printf %s "$PYTORCH_CUDA_ALLOC_CONF|$TUNER_WORLD_SIZE"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == f"{k['alloc_conf']}|2"
    assert all(line.startswith("export ") and shlex.split(line) for line in text.splitlines())


@pytest.mark.parametrize("fmt", FORMATS)
def test_render_every_format_is_parseable(fmt: str) -> None:
    if fmt == "recipe":  # their TRL recipe back: nothing to write without one (tests/e2e/test_recipe_export.py)
        with pytest.raises(ConfigError, match=r"writes back a TRL recipe .* not a file of yours"):
            render(fmt, knobs(zero_stage=2), world_size=2, gradient_accumulation_steps=2)
        return
    text = render(fmt, knobs(zero_stage=2), world_size=2, gradient_accumulation_steps=2)
    assert text.endswith("\n")
    if fmt in ("json", "deepspeed", "hf"):
        doc = json.loads(text)
        assert doc
    if fmt == "json":
        assert doc["global_batch"] == 16 and doc["deepspeed"]["train_batch_size"] == 16 and "hf" in doc


@pytest.mark.parametrize(
    ("fmt", "kw", "match"),
    [
        ("yaml", {}, "unknown export format 'yaml'"),
        ("deepspeed", {"micro_batch_size": 0}, "micro_batch_size"),
        ("deepspeed", {"zero_stage": 4}, "zero_stage"),
        ("deepspeed", {"bogus": 1}, "bogus"),
        ("deepspeed", {"offload_optimizer": True}, "offload_optimizer needs zero_stage"),
        ("hf", {"precision": "fp8"}, "precision"),
        ("env", {"alloc_conf": "expandable_segments=True"}, "allocator syntax"),
    ],
)
def test_bad_input_is_a_one_line_tuner_error(fmt: str, kw: dict[str, object], match: str) -> None:
    with pytest.raises(TunerError, match=match) as info:
        render(fmt, knobs(**kw), world_size=1, gradient_accumulation_steps=1)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("world", "accum"), [(0, 1), (1, 0), (-2, 1)])
def test_bad_batch_arithmetic(world: int, accum: int) -> None:
    with pytest.raises(ConfigError):
        render("deepspeed", knobs(), world_size=world, gradient_accumulation_steps=accum)


def test_export_package_imports_no_torch() -> None:
    code = (
        "import sys, tuner.interop.export, tuner.interop.baseline; "
        "print(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@dataclass(frozen=True)
class _Best:  # the shape of tuner.records.Candidate that an export reads
    knobs: dict[str, object]
    config: dict[str, object]
    fingerprints: list[dict[str, object]] = dataclasses.field(default_factory=list)


def test_best_export_args_come_from_the_stored_config_and_the_definition() -> None:
    best = _Best(knobs(zero_stage=2), {"world_size": 4, "gradient_accumulation_steps": 2})
    args = best_export_args(best, {"world_size": 8, "baseline_source": USER_DS})
    version = installed_transformers()
    assert version is not None and version.startswith("5.")  # names TrainingArguments fields as this one does
    # the measured config wins
    assert args == ExportArgs(
        world_size=4, gradient_accumulation_steps=2, baseline=USER_DS, transformers_version=version
    )
    bare = best_export_args(_Best(knobs(), {}), {"world_size": 8, "baseline_source": "not a dict"})
    assert bare == ExportArgs(world_size=8, gradient_accumulation_steps=1, baseline=None, transformers_version=version)
    assert best_export_args(_Best(knobs(), {}), {}).world_size == 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_render_best_is_render_with_the_best_configs_args(fmt: str) -> None:
    best = _Best(knobs(zero_stage=2), {"world_size": 2, "gradient_accumulation_steps": 3})
    definition = {"world_size": 2, "baseline_source": USER_DS}
    if fmt == "recipe":
        definition["baseline_files"] = {"training_args": {"output_dir": "o", "packing": True, "max_length": 64}}
        definition["baseline_files"]["training_args_format"] = "yaml"
    files = UserFiles.of(definition.get("baseline_files"))
    expected = render(
        fmt,
        best.knobs,
        world_size=2,
        gradient_accumulation_steps=3,
        baseline=USER_DS,
        files=files,
        transformers_version=installed_transformers(),
    )
    assert render_best(fmt, best, definition) == expected
    if fmt == "recipe":  # their keys first, in their order, YAML as they wrote it
        doc = yaml.safe_load(expected)
        assert list(doc)[:3] == ["output_dir", "packing", "max_length"] and doc["per_device_train_batch_size"] == 4
    if fmt == "deepspeed":
        ds = json.loads(render_best(fmt, best, definition))
        assert ds["train_batch_size"] == 4 * 3 * 2 and ds["optimizer"] == USER_DS["optimizer"]


def test_an_alloc_conf_inherited_by_every_probe_is_carried_into_the_export() -> None:
    shell = [{"alloc_conf": "expandable_segments:True"}, {"alloc_conf": "expandable_segments:True"}]
    best = _Best(knobs(), {"world_size": 1}, shell)
    env = render_best("env", best, {})
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in env and "PYTORCH_ALLOC_CONF=" in env
    assert measured_knobs(_Best(knobs(alloc_conf="max_split_size_mb:64"), {}, shell))["alloc_conf"] == (
        "max_split_size_mb:64"  # the knob, when set, is what the probes ran with
    )
    mixed = [{"alloc_conf": "expandable_segments:True"}, {"alloc_conf": ""}]
    assert measured_knobs(_Best(knobs(), {}, mixed)).get("alloc_conf") is None  # they disagree: nothing invented
    assert measured_knobs(_Best(knobs(), {}, [])).get("alloc_conf") is None
