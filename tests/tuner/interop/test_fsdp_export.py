"""The exports of an FSDP2 config, read back by the installed accelerate and transformers as a user's run reads them:
the accelerate config through `accelerate launch`'s own config loading and the environment it derives, into
FullyShardedDataParallelPlugin; the TrainingArguments through transformers.TrainingArguments and the plugin arguments
it derives; the env export straight into the plugin; and one exported config started on 2 gloo ranks, sharded by
accelerate's own FSDP2 preparation (every parameter a DTensor). No mocks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from trials.contract import FsdpSettings, Knobs, free_port
from tuner.errors import ConfigError
from tuner.interop.export import UserFiles, render, to_summary
from tuner.interop.export.accelerate import to_accelerate

HELD = {
    "llama": FsdpSettings(transformer_layer_cls_to_wrap=("LlamaDecoderLayer",), state_dict_type="FULL_STATE_DICT"),
    "size": FsdpSettings(auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=1000, cpu_ram_efficient_loading=False),
    "none": FsdpSettings(auto_wrap_policy="NO_WRAP"),
}
CASES = [  # (reshard_after_forward, offload_params, gradient_checkpointing, precision, held)
    (True, False, False, "bf16", "llama"),
    (False, True, True, "fp32", "size"),
    (False, False, True, "fp16", "none"),
]


def knobs(raf: bool, offload: bool, ac: bool, precision: str) -> dict[str, Any]:
    return Knobs(
        micro_batch_size=2,
        max_length=64,
        engine="fsdp2",
        reshard_after_forward=raf,
        offload_params=offload,
        gradient_checkpointing=ac,
        precision=precision,  # type: ignore[arg-type]
    ).model_dump()


def launcher_env(config_file: Path) -> dict[str, str]:
    """What `accelerate launch --config_file FILE train.py` hands the training processes (FSDP: the multi-GPU
    launcher's environment), read with accelerate's own config loading and argument handling."""
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    assert isinstance(load_config_from_file(str(config_file)), ClusterConfig)
    args = launch_command_parser().parse_args(["--config_file", str(config_file), "train.py"])
    args, _, _ = _validate_launch_command(args)
    assert args.use_fsdp and not args.use_deepspeed  # distributed_type FSDP: the FSDP launcher
    env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_"))}


def plugin_from_env(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """FullyShardedDataParallelPlugin as Accelerator() builds it from the environment, its mixed precision set as
    AcceleratorState sets it."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    for key in [k for k in os.environ if k.startswith(("FSDP_", "ACCELERATE_"))]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    mixed = env.get("ACCELERATE_MIXED_PRECISION", "no")
    if mixed != "no":
        plugin.set_mixed_precision(mixed)
    return plugin


def check_plugin(plugin: Any, case: tuple[bool, bool, bool, str, str]) -> None:
    """The plugin runs what the probes ran: version 2, the tuned knobs, the held settings, the precision."""
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    raf, offload, ac, precision, name = case
    held = HELD[name]
    assert plugin.fsdp_version == 2
    assert plugin.reshard_after_forward is raf
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) is offload
    assert plugin.activation_checkpointing is ac
    wrap = {"TRANSFORMER_BASED_WRAP": transformer_auto_wrap_policy, "SIZE_BASED_WRAP": size_based_auto_wrap_policy}
    assert plugin.auto_wrap_policy is wrap.get(held.auto_wrap_policy)
    if held.transformer_layer_cls_to_wrap:
        assert list(plugin.transformer_cls_names_to_wrap) == list(held.transformer_layer_cls_to_wrap)
    if held.auto_wrap_policy == "SIZE_BASED_WRAP":
        assert plugin.min_num_params == held.min_num_params
    assert plugin.state_dict_type.name == held.state_dict_type
    assert plugin.cpu_ram_efficient_loading is held.cpu_ram_efficient_loading
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    policy = plugin.mixed_precision_policy
    assert (policy.param_dtype if policy is not None else None) == dtypes.get(precision)


@pytest.mark.parametrize("case", CASES)
def test_accelerate_launch_reads_the_export_into_the_fsdp2_plugin(
    case: tuple[bool, bool, bool, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raf, offload, ac, precision, name = case
    path = tmp_path / "accelerate.yaml"
    fsdp = HELD[name].model_dump()
    path.write_text(
        render("accelerate", knobs(raf, offload, ac, precision), world_size=2, gradient_accumulation_steps=2, fsdp=fsdp)
    )
    block = yaml.safe_load(path.read_text())["fsdp_config"]
    tuned = {"fsdp_version", "fsdp_reshard_after_forward", "fsdp_offload_params", "fsdp_activation_checkpointing"}
    assert tuned <= set(block)  # every tuned key explicit, whatever the launcher's defaults
    env = launcher_env(path)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    check_plugin(plugin_from_env(env, monkeypatch), case)


@pytest.mark.parametrize("case", CASES)
def test_training_arguments_derive_the_fsdp2_plugin_of_the_export(
    case: tuple[bool, bool, bool, str, str], tmp_path: Path
) -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import TrainingArguments

    raf, offload, ac, precision, name = case
    text = render(
        "hf",
        knobs(raf, offload, ac, precision),
        world_size=2,
        gradient_accumulation_steps=2,
        fsdp=HELD[name].model_dump(),
        transformers_version="5.25.0",
    )
    kwargs = json.loads(text)
    assert kwargs["fsdp"] is True and kwargs["fsdp_config"]["version"] == 2
    assert kwargs["fsdp_config"]["reshard_after_forward"] is raf  # explicit: older transformers defaulted to false
    assert kwargs["activation_checkpointing"] is False  # FSDP's own lives in fsdp_config: the Trainer refuses both
    mixed = {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no")
    if (
        precision == "fp16"
    ):  # TrainingArguments refuses fp16 on a CPU-only host; the plugin arguments do not depend on it
        kwargs["fp16"] = False
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **kwargs)
    assert args.activation_checkpointing is False
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)  # what the Trainer hands its Accelerator
    if mixed != "no":
        plugin.set_mixed_precision(mixed)
    check_plugin(plugin, case)


@pytest.mark.parametrize("case", CASES)
def test_the_env_export_builds_the_same_plugin(
    case: tuple[bool, bool, bool, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    raf, offload, ac, precision, name = case
    text = render(
        "env",
        knobs(raf, offload, ac, precision),
        world_size=2,
        gradient_accumulation_steps=2,
        fsdp=HELD[name].model_dump(),
    )
    env = dict(line.removeprefix("export ").split("=", 1) for line in text.splitlines())
    assert env["TUNER_ENGINE"] == "fsdp2" and env["TUNER_RESHARD_AFTER_FORWARD"] == str(int(raf))
    assert "TUNER_ZERO_STAGE" not in env and env["TUNER_GRADIENT_CHECKPOINTING"] == "0"
    check_plugin(plugin_from_env({k: v for k, v in env.items() if not k.startswith("TUNER_")}, monkeypatch), case)


def test_an_fsdp2_pick_has_no_deepspeed_json_and_says_which_exports_it_has() -> None:
    k = knobs(True, False, False, "bf16")
    with pytest.raises(ConfigError) as err:
        render("deepspeed", k, world_size=2, gradient_accumulation_steps=1)
    assert "\n" not in str(err.value) and "engine fsdp2" in str(err.value) and "--format" in str(err.value)
    summary = to_summary(k, world_size=2, gradient_accumulation_steps=1)
    assert "deepspeed" not in summary and summary["accelerate"]["distributed_type"] == "FSDP"
    assert summary["hf"]["fsdp_config"]["version"] == 2 and summary["env"]["FSDP_VERSION"] == "2"


def test_their_accelerate_config_keeps_their_keys_with_only_the_engine_changed() -> None:
    given = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "gpu_ids": "0,1",
        "main_process_port": 29555,
        "mixed_precision": "no",
        "num_processes": 2,
        "fsdp_config": {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": True,
            "fsdp_use_orig_params": True,  # FSDP1's, carried as they wrote it
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        },
    }
    held = FsdpSettings(cpu_ram_efficient_loading=False)
    out = to_accelerate(
        knobs(False, False, True, "bf16"), world_size=2, gradient_accumulation_steps=1, fsdp=held, given=given
    )
    assert out["gpu_ids"] == "0,1" and out["main_process_port"] == 29555 and out["mixed_precision"] == "bf16"
    block = out["fsdp_config"]
    assert block["fsdp_use_orig_params"] is True and block["fsdp_reshard_after_forward"] is False
    assert block["fsdp_activation_checkpointing"] is True and block["fsdp_cpu_ram_efficient_loading"] is False
    # a DeepSpeed pick of the same study: their launcher settings stay, the FSDP block goes
    ds = to_accelerate(
        {"micro_batch_size": 2, "max_length": 64, "zero_stage": 2},
        world_size=2,
        gradient_accumulation_steps=1,
        given=given,
    )
    assert ds["distributed_type"] == "DEEPSPEED" and "fsdp_config" not in ds and "mixed_precision" not in ds
    assert ds["gpu_ids"] == "0,1"


def test_their_training_args_keep_their_spelling_and_lose_fsdp_for_another_engine() -> None:
    given = {
        "per_device_train_batch_size": 4,
        "output_dir": "out",
        "fsdp": True,
        "fsdp_config": {"fsdp_reshard_after_forward": True, "fsdp_state_dict_type": "SHARDED_STATE_DICT"},
        "learning_rate": 3e-4,
    }
    files = UserFiles(training_args=given)
    held = FsdpSettings(state_dict_type="SHARDED_STATE_DICT", cpu_ram_efficient_loading=False)
    hf = json.loads(
        render(
            "hf",
            knobs(False, True, False, "fp32"),
            world_size=2,
            gradient_accumulation_steps=1,
            files=files,
            fsdp=held.model_dump(),
            transformers_version="5.25.0",
        )
    )
    assert hf["learning_rate"] == 3e-4 and hf["output_dir"] == "out" and hf["per_device_train_batch_size"] == 2
    block = hf["fsdp_config"]
    assert block["fsdp_reshard_after_forward"] is False and "reshard_after_forward" not in block  # their spelling
    assert block["cpu_offload"] is True and block["version"] == 2
    other = json.loads(
        render(
            "hf",
            {"micro_batch_size": 2, "max_length": 64, "zero_stage": 2},
            world_size=2,
            gradient_accumulation_steps=1,
            files=files,
            transformers_version="5.25.0",
        )
    )
    assert "fsdp" not in other and "fsdp_config" not in other and other["deepspeed"]["zero_optimization"]["stage"] == 2


def test_the_exported_accelerate_config_shards_tiny_llama_on_two_gloo_ranks(
    tmp_path: Path,
) -> None:
    """The export started under real accelerate code: the launcher's environment for the exported YAML, the plugin
    each rank builds from it, accelerate's own FSDP2 preparation of builtin:tiny-llama on 2 gloo ranks; every
    parameter comes back a DTensor sharded over both ranks, and a step runs on the shards."""
    import torch.multiprocessing as mp

    from tests.helpers.fsdp_export_ranks import run_rank

    config = tmp_path / "accelerate.yaml"
    held = FsdpSettings(cpu_ram_efficient_loading=True)  # rank 0 loads, the other gets its weights by broadcast
    config.write_text(
        render(
            "accelerate",
            knobs(False, False, True, "bf16"),
            world_size=2,
            gradient_accumulation_steps=1,
            fsdp=held.model_dump(),
        )
    )
    env = launcher_env(config)
    # fork: the ranks start from this process's imports (a CPU-only parent, no CUDA state to inherit)
    mp.start_processes(run_rank, args=(2, free_port(), env, str(tmp_path)), nprocs=2, join=True, start_method="fork")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for found in ranks:
        assert found["params"] > 0 and found["dtensors"] == found["params"]  # every parameter a DTensor shard
        assert found["mesh_sizes"] == [2] and found["groups"] > 1  # over both ranks, per block (wrap policy)
        assert found["fsdp_version"] == 2 and found["reshard_after_forward"] is False
        assert found["activation_checkpointing"] is True and found["param_dtype"] == "torch.bfloat16"
        assert torch.isfinite(torch.tensor(found["loss"]))
    assert ranks[0]["loss"] == pytest.approx(ranks[1]["loss"])  # one model, sharded: both ranks see the same loss
