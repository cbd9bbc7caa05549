"""Every export is accepted by the real tool that reads it: DeepSpeed's config class, HF TrainingArguments and
accelerate's launcher config path. No GPU needed; no mocks.

DeepSpeedConfig checks train_batch_size == micro x accum x world, where world comes from ``dist.get_world_size()``
or, given an ``mpu``, from ``mpu.get_data_parallel_world_size()`` -- but only once deepspeed.comm is initialised
(otherwise it silently falls back to world size 1). So the module initialises a one-rank gloo group (the env vars of
the field note, a free port) and validates each export at its real world size through a small data-parallel mpu;
the same mpu at a wrong world size must be rejected, which proves the check is live.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tuner.interop.export import render, to_deepspeed, to_hf
from tuner.interop.export.mapping import ZERO_KEYS
from tuner.settings import load_settings

KNOB_GRID = [
    {
        "micro_batch_size": 2,
        "max_length": 64,
        "zero_stage": stage,
        "offload_optimizer": offload,
        "precision": prec,
        "overlap_comm": stage == 2,
        "reduce_bucket_size": 50_000_000 if stage else None,
    }
    for stage, offload, prec in itertools.product(range(4), (False, True), ("fp32", "bf16", "fp16"))
    if not (offload and stage == 0)
]
USER_DS = {
    "gradient_clipping": 0.7,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-4, "betas": [0.9, 0.98], "eps": 1e-8, "weight_decay": 0.0}},
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-4, "warmup_num_steps": 10, "total_num_steps": 100},
    },
    "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 200},
    "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 1000, "sub_group_size": 1_000_000},
}


class DataParallelMpu:
    """The slice of Megatron's mpu interface DeepSpeedConfig reads: the data-parallel world size."""

    def __init__(self, world: int) -> None:
        self.world = world

    def get_data_parallel_world_size(self) -> int:
        return self.world

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


@pytest.fixture(scope="module")
def ds_comm() -> Iterator[None]:
    import deepspeed
    import deepspeed.comm as dist

    created = not dist.is_initialized()
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_EXTENSIONS_DIR", "PATH")
    saved = {k: os.environ.get(k) for k in names}
    if created:
        # the shm comm op loads from the probes' cache, built with the venv's ninja (another one forces a rebuild)
        os.environ["TORCH_EXTENSIONS_DIR"] = str(load_settings().torch_extensions_dir)
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    yield
    if created:
        dist.destroy_process_group()
        dist.comm.cdb = None
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def ds_validate(config: dict[str, Any], world: int) -> Any:
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig(copy.deepcopy(config), mpu=DataParallelMpu(world))


def _enabled(parsed: Any, precision: str) -> bool:
    """DeepSpeedConfig's precision switch: ``<precision>_config.enabled`` (newer DeepSpeed) or ``bfloat16_enabled`` /
    ``fp16_enabled`` (the 0.15 floor, scripts/compat.sh)."""
    config = getattr(parsed, f"{precision}_config", None)
    old = {"bfloat16": "bfloat16_enabled", "float16": "fp16_enabled"}[precision]
    return bool(config.enabled if config is not None else getattr(parsed, old))


@pytest.mark.parametrize("world", [1, 4])
@pytest.mark.parametrize("baseline", [None, USER_DS], ids=["plain", "baseline"])
@pytest.mark.parametrize(
    "knobs", KNOB_GRID, ids=lambda k: f"z{k['zero_stage']}-off{int(k['offload_optimizer'])}-{k['precision']}"
)
def test_deepspeed_config_accepts_every_export(ds_comm: None, knobs: dict, baseline: dict | None, world: int) -> None:
    config = json.loads(render("deepspeed", knobs, world_size=world, gradient_accumulation_steps=3, baseline=baseline))
    parsed = ds_validate(config, world)
    assert parsed.world_size == world
    assert parsed.train_batch_size == 2 * 3 * world
    assert parsed.zero_optimization_stage == knobs["zero_stage"]
    assert _enabled(parsed, "bfloat16") is (knobs["precision"] == "bf16")
    assert _enabled(parsed, "float16") is (knobs["precision"] == "fp16")
    if knobs["zero_stage"]:
        assert parsed.zero_config.reduce_bucket_size == 50_000_000
        device = parsed.zero_config.offload_optimizer.device
        assert getattr(device, "value", device) == ("cpu" if knobs["offload_optimizer"] else "none")
    if baseline:
        assert parsed.gradient_clipping == 0.7
        assert parsed.optimizer_name == "adamw" and parsed.scheduler_name == "WarmupDecayLR"


def test_the_world_size_check_is_live(ds_comm: None) -> None:
    config = to_deepspeed({"micro_batch_size": 2, "max_length": 8}, world_size=4, gradient_accumulation_steps=2)
    ds_validate(config, 4)
    with pytest.raises(AssertionError, match="train_batch_size"):
        ds_validate(config, 3)


def test_zero_key_table_matches_deepspeed() -> None:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    fields = DeepSpeedZeroConfig.model_fields
    accepted = set(fields) | {f.alias for f in fields.values() if f.alias}
    assert accepted == ZERO_KEYS


@pytest.mark.parametrize(
    "knobs",
    [k for k in KNOB_GRID if k["precision"] != "fp16"],
    ids=lambda k: f"z{k['zero_stage']}-off{int(k['offload_optimizer'])}-{k['precision']}",
)
def test_training_arguments_accept_the_deepspeed_export(tmp_path: Path, knobs: dict) -> None:
    """World size 1 (one CPU process): the Trainer's own mismatch check then runs for real (trainer_config_finalize).
    fp16 is left out: TrainingArguments refuses fp16 without a GPU."""
    import torch
    from transformers import TrainingArguments

    ds = to_deepspeed(knobs, world_size=1, gradient_accumulation_steps=2, baseline=USER_DS)
    bf16 = knobs["precision"] == "bf16"
    args = TrainingArguments(
        output_dir=str(tmp_path),
        deepspeed=ds,
        use_cpu=True,
        bf16=bf16,
        report_to=[],
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_grad_norm=0.7,
        learning_rate=2e-4,
        adam_beta2=0.98,
        weight_decay=0.0,
        warmup_steps=10,
    )
    hf_ds = args.hf_deepspeed_config
    hf_ds.trainer_config_finalize(args, torch.nn.Linear(2, 2), num_training_steps=100)  # raises on any mismatch
    assert hf_ds.config["zero_optimization"]["stage"] == knobs["zero_stage"]
    assert hf_ds.is_zero3() is (knobs["zero_stage"] == 3)
    # HF only calls it offload at stage >= 2 (DeepSpeed offloads stage 1 too)
    assert hf_ds.is_offload() is (knobs["offload_optimizer"] and knobs["zero_stage"] >= 2)


@pytest.mark.parametrize(
    "knobs",
    [k for k in KNOB_GRID if k["precision"] != "fp16"][::2],
    ids=lambda k: f"z{k['zero_stage']}-off{int(k['offload_optimizer'])}-{k['precision']}",
)
def test_hf_export_builds_seq2seq_training_arguments(tmp_path: Path, knobs: dict) -> None:
    import torch
    from transformers import Seq2SeqTrainingArguments

    kwargs = to_hf(
        {**knobs, "eval_batch_size": 1, "generate": True}, world_size=1, gradient_accumulation_steps=2, baseline=USER_DS
    )
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kwargs)
    assert args.per_device_train_batch_size == 2 and args.gradient_accumulation_steps == 2
    assert args.predict_with_generate and args.per_device_eval_batch_size == 1 and args.learning_rate == 2e-4
    assert args.max_steps == 100 and args.warmup_steps == 10  # the scheduler's explicit steps moved into the kwargs
    args.hf_deepspeed_config.trainer_config_finalize(args, torch.nn.Linear(2, 2), num_training_steps=args.max_steps)
    config = args.hf_deepspeed_config.config
    assert config["train_batch_size"] == 4 and config["optimizer"]["params"]["lr"] == 2e-4
    assert config["gradient_clipping"] == 0.7


@pytest.mark.parametrize(("engine", "stage"), [("deepspeed", 0), ("deepspeed", 2), ("deepspeed", 3), ("torch", 0)])
def test_accelerate_launch_reads_the_yaml_and_the_plugin_loads_the_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: int, engine: str
) -> None:
    """What `accelerate launch --config_file` does before spawning: load + validate the YAML, turn it into the
    launcher's environment; then the DeepSpeedPlugin of the training process reads that environment and the JSON."""
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    knobs = {"micro_batch_size": 2, "max_length": 8, "engine": engine, "zero_stage": stage, "precision": "bf16"}
    (tmp_path / "accelerate.yaml").write_text(render("accelerate", knobs, world_size=2, gradient_accumulation_steps=4))
    (tmp_path / "ds_config.json").write_text(render("deepspeed", knobs, world_size=2, gradient_accumulation_steps=4))
    monkeypatch.chdir(tmp_path)
    loaded = load_config_from_file(str(tmp_path / "accelerate.yaml"))
    assert isinstance(loaded, ClusterConfig) and loaded.num_processes == 2
    args = launch_command_parser().parse_args(["--config_file", str(tmp_path / "accelerate.yaml"), "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    assert args.num_processes == 2
    if engine == "torch":
        assert not args.use_deepspeed and args.mixed_precision == "bf16"
        return
    assert args.use_deepspeed
    # launch_command's own bookkeeping before deepspeed_launcher (accelerate/commands/launch.py)
    fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    _, env = prepare_deepspeed_cmd_env(args)
    for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("ACCELERATE_"):
            monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()  # raises if the YAML sets fields a deepspeed_config_file forbids
    assert plugin.zero_stage == stage
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == 2
    assert plugin.deepspeed_config["bf16"]["enabled"] is True
    assert plugin.zero3_init_flag is (stage == 3)
