"""An FSDP2 baseline imported as trial 0 exactly as it is: an accelerate config with an fsdp_config block (beside the
training args), or TrainingArguments with fsdp / fsdp_config, read with the defaults each file's reader has; carried to
every probe (SearchRequest -> study definition -> SearchSetup -> ProbeConfig.fsdp) and through a resume; and every
key accelerate / the Trainer would refuse or silently drop is one line naming it and the fix (exit 2 on the CLI)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from trials.contract import FsdpSettings, Knobs, ModelSpec
from tuner.errors import BaselineError, ConfigError
from tuner.interop.baseline import parse_baseline
from tuner.interop.baseline_files import load_baseline
from tuner.interop.export import UserFiles, render
from tuner.job.space import default_space
from tuner.records import Fidelity
from tuner.search.request import build_request, check_resume, request_from_definition
from tuner.search.setup import SearchSetup

ARGS = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "output_dir": "out", "max_seq_length": 64}
ACCELERATE: dict[str, Any] = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "FSDP",
    "mixed_precision": "bf16",
    "num_processes": 2,
    "gpu_ids": "all",
    "fsdp_config": {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": False,
        "fsdp_offload_params": True,
        "fsdp_activation_checkpointing": True,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer, LlamaMLP",
        "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_use_orig_params": True,
    },
}


def with_block(**block: Any) -> dict[str, Any]:
    return {**ACCELERATE, "fsdp_config": block}


def test_an_accelerate_config_is_trial_zero_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "accelerate.yaml").write_text(yaml.safe_dump(ACCELERATE))
    (tmp_path / "args.json").write_text(json.dumps(ARGS))
    base = load_baseline(tmp_path / "accelerate.yaml", tmp_path / "args.json")
    k = Knobs.model_validate(base.knobs)
    assert (k.engine, k.reshard_after_forward, k.offload_params, k.gradient_checkpointing) == (
        "fsdp2",
        False,
        True,
        True,
    )
    assert (k.precision, k.micro_batch_size, k.max_length) == ("bf16", 4, 64)  # mixed_precision: the config's
    assert (base.world_size, base.gradient_accumulation_steps, base.global_batch) == (2, 2, 16)  # num_processes
    held = FsdpSettings.model_validate(base.fsdp)
    assert held.transformer_layer_cls_to_wrap == ("LlamaDecoderLayer", "LlamaMLP")
    assert held.state_dict_type == "FULL_STATE_DICT" and held.cpu_ram_efficient_loading is True  # the launcher's
    assert base.files()["accelerate"] == ACCELERATE and base.ds_given is None
    assert any("fsdp_use_orig_params" in note and "FSDP1" in note for note in base.notes)


def test_training_args_with_fsdp_read_as_transformers_reads_them(tmp_path: Path) -> None:
    (tmp_path / "fsdp.json").write_text(json.dumps({"fsdp_reshard_after_forward": False, "cpu_offload": False}))
    (tmp_path / "args.json").write_text(json.dumps({**ARGS, "fsdp": True, "fsdp_config": "fsdp.json", "fp16": True}))
    base = load_baseline(tmp_path / "args.json")  # the fsdp_config file it names is read next to it
    k = Knobs.model_validate(base.knobs)
    assert (k.engine, k.reshard_after_forward, k.precision) == ("fsdp2", False, "fp16")
    # what transformers 5.25 runs when fsdp_config leaves a key out (not accelerate's launcher defaults)
    assert FsdpSettings.model_validate(base.fsdp) == FsdpSettings(
        state_dict_type="FULL_STATE_DICT", cpu_ram_efficient_loading=False
    )
    assert base.files()["training_args"]["fsdp_config"] == {"fsdp_reshard_after_forward": False, "cpu_offload": False}
    assert "accelerate" not in base.files()


def test_the_deprecated_fsdp_string_and_the_training_argument_checkpointing() -> None:
    base = parse_baseline(None, {**ARGS, "fsdp": "shard_grad_op auto_wrap offload", "activation_checkpointing": True})
    k = Knobs.model_validate(base.knobs)
    assert (k.reshard_after_forward, k.offload_params, k.gradient_checkpointing) == (False, True, True)
    assert any("deprecated" in n for n in base.notes) and any("probed as FSDP's own" in n for n in base.notes)


@pytest.mark.parametrize(
    ("raf", "offload", "ac", "precision", "held"),
    [
        (False, True, True, "bf16", FsdpSettings(transformer_layer_cls_to_wrap=("LlamaDecoderLayer",))),
        (True, False, False, "fp32", FsdpSettings(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=5000)),
        (True, True, False, "fp16", FsdpSettings(auto_wrap_policy="NO_WRAP", cpu_ram_efficient_loading=False)),
    ],
)
def test_an_export_imports_back_as_the_same_config(
    raf: bool, offload: bool, ac: bool, precision: str, held: FsdpSettings
) -> None:
    knobs = Knobs(
        micro_batch_size=4,
        max_length=64,
        engine="fsdp2",
        reshard_after_forward=raf,
        offload_params=offload,
        gradient_checkpointing=ac,
        precision=precision,
        eval_batch_size=None,  # an export without their training args says no eval schedule: nothing evaluates
    )
    kw: dict[str, Any] = {"world_size": 2, "gradient_accumulation_steps": 2, "fsdp": held.model_dump()}
    accelerate = yaml.safe_load(render("accelerate", knobs.model_dump(), **kw))
    hf = json.loads(render("hf", knobs.model_dump(), **kw, transformers_version="5.25.0"))
    args = {k: v for k, v in hf.items() if k not in ("fsdp", "fsdp_config", "bf16", "fp16")}
    for base in (
        parse_baseline(None, args, accelerate=accelerate, max_length=64),
        parse_baseline(None, hf, max_length=64),
    ):
        assert Knobs.model_validate(base.knobs) == knobs
        assert FsdpSettings.model_validate(base.fsdp) == held
        assert base.global_batch in (None, 16)


REFUSED = [
    (
        "forward-prefetch",
        with_block(fsdp_version=2, fsdp_forward_prefetch=True),
        None,
        r"fsdp_forward_prefetch.*remove",
    ),
    ("integer-reshard", with_block(fsdp_version=2, fsdp_reshard_after_forward=2), None, r"integer.*true.*false"),
    ("fsdp1-reshard", with_block(fsdp_version=2, fsdp_reshard_after_forward="SHARD_GRAD_OP"), None, r"FSDP1's"),
    ("version-missing", with_block(fsdp_reshard_after_forward=True), None, r"fsdp_version is missing.*set it to 2"),
    ("version-1", with_block(fsdp_version=1), None, r"fsdp_version is 1.*to-fsdp2"),
    ("sharding-strategy", with_block(fsdp_version=2, fsdp_sharding_strategy="FULL_SHARD"), None, r"reshard_after"),
    ("typo", with_block(fsdp_version=2, fsdp_reshard_after_foward=False), None, r"did you mean 'fsdp_reshard_after"),
    ("local-state-dict", with_block(fsdp_version=2, fsdp_state_dict_type="LOCAL_STATE_DICT"), None, r"LOCAL_STATE"),
    ("class-list", with_block(fsdp_version=2, fsdp_transformer_layer_cls_to_wrap=["A"]), None, r"comma-separated"),
    ("ac-offload", with_block(fsdp_version=2, fsdp_activation_checkpointing_offload=True), None, r"offload"),
    ("sync-off", with_block(fsdp_version=2, fsdp_sync_module_states=False), None, r"sync_module_states true"),
    ("multi-gpu-type", {**ACCELERATE, "distributed_type": "MULTI_GPU"}, None, r"MULTI_GPU.*training args"),
    ("fp8", {**ACCELERATE, "mixed_precision": "fp8"}, None, r"fp8"),
    ("alone", ACCELERATE, "no args", r"holds no batch size.*--training-args"),
    ("args-forward-prefetch", None, {"fsdp": True, "fsdp_config": {"forward_prefetch": True}}, r"forward_prefetch"),
    ("args-integer-reshard", None, {"fsdp": True, "fsdp_config": {"reshard_after_forward": 1}}, r"integer"),
    ("args-version-1", None, {"fsdp": True, "fsdp_config": {"version": 1}}, r"version is 1"),
    ("args-typo", None, {"fsdp": True, "fsdp_config": {"cpu_offlaod": True}}, r"did you mean 'cpu_offload'"),
    ("args-hybrid", None, {"fsdp": "hybrid_shard"}, r"not an FSDP2 option"),
    ("args-xla", None, {"fsdp": True, "fsdp_config": {"xla": True}}, r"XLA"),
    (
        "args-both-ac",
        None,
        {"fsdp": True, "activation_checkpointing": True, "fsdp_config": {"activation_checkpointing": True}},
        r"both true",
    ),
    ("args-and-deepspeed", None, {"fsdp": True, "deepspeed": {"zero_optimization": {"stage": 2}}}, r"DeepSpeed too"),
]


@pytest.mark.parametrize(("name", "accelerate", "args", "expect"), REFUSED, ids=[r[0] for r in REFUSED])
def test_what_accelerate_or_the_trainer_would_refuse_or_drop_is_one_line(
    name: str, accelerate: dict[str, Any] | None, args: Any, expect: str
) -> None:
    training_args = None if args == "no args" else {**ARGS, **(args or {})}
    with pytest.raises(BaselineError) as err:
        parse_baseline(None, training_args, accelerate=accelerate, max_length=64)
    line = str(err.value)
    assert "\n" not in line and re.search(expect, line), line


def request(accelerate: dict[str, Any], world_size: int | None = None) -> Any:
    def load(world: int | None, max_length: int) -> Any:
        return parse_baseline(None, ARGS, accelerate=accelerate, world_size=world, max_length=max_length)

    space = default_space().restrict(engine=["fsdp2"], zero_stage=[0], reshard_after_forward=[True, False])
    return build_request(
        study_name="f",
        storage="sqlite://",
        model=ModelSpec(source="builtin:tiny-llama"),
        space=space,
        budget_s=60,
        baseline=load,
        world_size=world_size,
    )


def test_the_held_settings_reach_every_probe_and_survive_a_resume() -> None:
    req = request(ACCELERATE)
    held = FsdpSettings.model_validate(req.fsdp)
    assert req.baseline is not None and req.baseline.engine == "fsdp2" and req.world_size == 2
    definition = req.definition()
    assert definition["fsdp"] == req.fsdp and definition["baseline_files"]["accelerate"] == ACCELERATE
    setup = SearchSetup.of(request_from_definition(req, json.loads(json.dumps(definition))))
    trial0 = setup.probe_config(req.baseline, Fidelity.BASELINE, 60)
    other = setup.probe_config(
        Knobs.model_validate({**req.baseline.model_dump(), "micro_batch_size": 2}), Fidelity.SHORT, 60
    )
    assert trial0.fsdp == held and other.fsdp == held and trial0.deepspeed is None
    assert trial0.knobs.reshard_after_forward is False and trial0.knobs.offload_params is True
    ds = setup.probe_config(Knobs(micro_batch_size=2, max_length=64, zero_stage=2), Fidelity.SHORT, 60)
    assert ds.fsdp is None  # a DeepSpeed config of the same study holds no FSDP settings
    changed = request(with_block(**{**ACCELERATE["fsdp_config"], "fsdp_state_dict_type": "SHARDED_STATE_DICT"}))
    with pytest.raises(ConfigError, match="created with a different baseline_files"):
        check_resume("f", definition, changed.definition(), {"baseline"})
    held_only = {**definition, "fsdp": {**definition["fsdp"], "state_dict_type": "SHARDED_STATE_DICT"}}
    with pytest.raises(ConfigError, match="created with a different fsdp"):
        check_resume("f", definition, held_only, {"baseline"})


def test_the_world_size_and_num_processes_must_agree() -> None:
    with pytest.raises(BaselineError, match="num_processes 2"):
        request(ACCELERATE, world_size=4)


def test_the_export_of_their_files_changes_only_what_was_tuned() -> None:
    base = parse_baseline(None, ARGS, accelerate=ACCELERATE, max_length=64)
    knobs = {**base.knobs, "reshard_after_forward": True, "micro_batch_size": 2}
    kw: dict[str, Any] = {"world_size": 2, "gradient_accumulation_steps": 4, "fsdp": base.fsdp}
    out = yaml.safe_load(render("accelerate", knobs, **kw, files=UserFiles.of(base.files())))
    assert {k: v for k, v in out.items() if k != "fsdp_config"} == {
        k: v for k, v in ACCELERATE.items() if k != "fsdp_config"
    }
    before, after = ACCELERATE["fsdp_config"], out["fsdp_config"]
    changed = {k for k in after if before.get(k) != after[k]}
    assert changed == {
        "fsdp_reshard_after_forward",
        "fsdp_transformer_layer_cls_to_wrap",
        "fsdp_cpu_ram_efficient_loading",
    }
    assert (
        after["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer,LlamaMLP"
    )  # their classes, as the launcher splits them
    assert after["fsdp_cpu_ram_efficient_loading"] is True  # made explicit: what their launcher ran by default


@pytest.mark.parametrize(
    ("files", "expect"),
    [
        ({"accelerate.yaml": ACCELERATE}, r"holds no batch size"),
        ({"accelerate.yaml": with_block(fsdp_version=2, fsdp_forward_prefetch=True), "args.json": ARGS}, r"forward"),
        ({"accelerate.yaml": with_block(fsdp_reshard_after_forward=True), "args.json": ARGS}, r"FSDP2.*set it to 2"),
    ],
)
def test_tuner_search_refuses_in_one_line(
    files: dict[str, Any],
    expect: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tuner.cli import main as tuner_main

    for name, content in files.items():
        (tmp_path / name).write_text(yaml.safe_dump(content) if name.endswith(".yaml") else json.dumps(content))
    argv = [
        "tuner",
        "search",
        "--budget",
        "1m",
        "--model",
        "builtin:tiny-llama",
        "--baseline",
        str(tmp_path / "accelerate.yaml"),
    ]
    if "args.json" in files:
        argv += ["--training-args", str(tmp_path / "args.json")]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNER_STORAGE", f"sqlite:///{tmp_path / 't.db'}")
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        tuner_main()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert re.search(expect, err[0]), err[0]
