"""accelerate's DeepSpeed-plugin configs (tuner.interop.baseline_plugin): the DeepSpeed config tuner reads from a
``deepspeed_config`` block is the one accelerate itself builds when `accelerate launch` starts their script (its
launcher's environment, then DeepSpeedPlugin in the training process: run here in a subprocess), and the baseline
reads it as a DeepSpeed JSON (trial 0 is their config, "auto" filled from their training args)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tuner.errors import BaselineError
from tuner.interop.baseline import parse_baseline
from tuner.interop.baseline_plugin import plugin_ds_config
from tuner.interop.export import UserFiles, render

# alignment-handbook's recipes/accelerate_configs/zero3.yaml (num_processes 2 here: the tests' world)
ZERO3 = (Path(__file__).resolve().parents[2] / "data" / "handbook-zero3.yaml").read_text()
ARGS = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": True, "max_seq_length": 64}

# what accelerate does with a config file: its launcher's environment, then the plugin the training process builds
ACCELERATE = r"""
import json, os, sys
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import prepare_deepspeed_cmd_env
args = launch_command_parser().parse_args(["--config_file", sys.argv[1], "train.py"])
args, defaults, _ = _validate_launch_command(args)
args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
_, env = prepare_deepspeed_cmd_env(args)
os.environ.clear()
os.environ.update(env)
from accelerate.utils.dataclasses import DeepSpeedPlugin
plugin = DeepSpeedPlugin()
plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])
config = dict(plugin.deepspeed_config)
config.pop("steps_per_print")
print(json.dumps(config))
"""


def accelerates_own(config: dict[str, Any], tmp: Path) -> dict[str, Any]:
    path = tmp / "accelerate.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-c", ACCELERATE, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


CASES = [
    (yaml.safe_load(ZERO3)["deepspeed_config"], "bf16"),
    (
        {
            "zero_stage": 2,
            "offload_optimizer_device": "cpu",
            "gradient_clipping": 0.5,
            "gradient_accumulation_steps": 4,
        },
        "fp16",
    ),
    (
        {"zero_stage": 3, "offload_optimizer_device": "cpu", "offload_param_device": "cpu", "zero3_init_flag": True},
        "no",
    ),
    ({"zero_stage": 1}, "bf16"),
    ({}, "no"),
]


@pytest.mark.parametrize(
    ("block", "precision"), CASES, ids=["handbook-zero3", "zero2", "zero3-offload", "zero1", "empty"]
)
def test_the_plugin_block_is_the_deepspeed_config_accelerate_builds(
    block: dict[str, Any], precision: str, tmp_path: Path
) -> None:
    config = {**yaml.safe_load(ZERO3), "deepspeed_config": block, "mixed_precision": precision}
    assert plugin_ds_config(block, precision) == accelerates_own(config, tmp_path)


def test_the_handbook_zero3_recipe_is_trial_0_as_zero3_with_the_trainers_autos_filled() -> None:
    base = parse_baseline(None, ARGS, accelerate={**yaml.safe_load(ZERO3), "num_processes": 2})
    assert base.knobs["engine"] == "deepspeed" and base.knobs["zero_stage"] == 3 and base.knobs["precision"] == "bf16"
    assert base.world_size == 2 and base.global_batch == 2 * 4 * 2 and base.gradient_accumulation_steps == 4
    ds = base.ds_config
    assert ds["train_micro_batch_size_per_gpu"] == 2 and ds["gradient_clipping"] == 1.0  # the Trainer's max_grad_norm
    assert ds["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True
    assert (
        base.ds_given is not None and base.ds_given["gradient_accumulation_steps"] == "auto"
    )  # as accelerate built it
    assert "accelerate config deepspeed_config.zero3_save_16bit_model" in base.kept
    assert base.accelerate_given is not None and base.accelerate_given["distributed_type"] == "DEEPSPEED"


@pytest.mark.parametrize(
    ("block", "said"),
    [
        ({"zero_stage": 3, "zero3_init_flag": False}, "zero3_init_flag: true"),
        ({"zero_stage": 2, "offload_optimizer_device": "nvme"}, "NVMe"),
        ({"deepspeed_config_file": "ds.json"}, "give that JSON as the baseline"),
        ({"zero_stag": 3}, "did you mean 'zero_stage'"),
        ({"deepspeed_moe_layer_cls_names": "MixtralSparseMoeBlock"}, "MoE"),
    ],
)
def test_what_a_probe_cannot_run_is_one_line(block: dict[str, Any], said: str) -> None:
    config = {**yaml.safe_load(ZERO3), "num_processes": 2, "deepspeed_config": block}
    with pytest.raises(BaselineError, match="accelerate config deepspeed_config") as err:
        parse_baseline(None, ARGS, accelerate=config)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_the_launchers_precision_must_agree_with_the_training_args_as_the_trainer_checks() -> None:
    config = {**yaml.safe_load(ZERO3), "num_processes": 2}
    with pytest.raises(BaselineError, match=r"bf16\.enabled=True contradicts training args bf16=False"):
        parse_baseline(None, {**ARGS, "bf16": False}, accelerate=config)
    fp16 = parse_baseline(None, {**ARGS, "bf16": False, "fp16": True}, accelerate=config)  # theirs win
    assert fp16.knobs["precision"] == "fp16"


def test_a_world_size_that_contradicts_num_processes_is_one_line() -> None:
    with pytest.raises(BaselineError, match="contradicts your accelerate config's num_processes 8"):
        parse_baseline(None, ARGS, accelerate=yaml.safe_load(ZERO3), world_size=2)


def test_the_exports_of_a_plugin_recipe_are_a_deepspeed_launch_of_its_config(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    given = {**yaml.safe_load(ZERO3), "num_processes": 2}
    given["deepspeed_config"] = {**given["deepspeed_config"], "deepspeed_hostfile": "/job/hostfile"}
    base = parse_baseline(None, ARGS, accelerate=given)
    knobs = {**base.knobs, "micro_batch_size": 1, "reduce_bucket_size": 50_000_000}
    kw: dict[str, Any] = {"world_size": 2, "gradient_accumulation_steps": 4, "files": UserFiles.of(base.files())}
    launch = yaml.safe_load(render("accelerate", knobs, **kw))
    block = launch["deepspeed_config"]
    assert launch["distributed_type"] == "DEEPSPEED" and block["deepspeed_config_file"] == "ds_config.json"
    assert block["deepspeed_hostfile"] == "/job/hostfile" and "zero_stage" not in block  # no plugin keys beside it
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(launch))
    assert isinstance(load_config_from_file(str(tmp_path / "a.yaml")), ClusterConfig)
    ds = json.loads(render("deepspeed", knobs, **kw, baseline=base.probe_source()))
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and zero["reduce_bucket_size"] == 50_000_000
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True  # theirs (zero3_save_16bit_model), kept
    assert ds["bf16"] == {"enabled": True}
