"""Knobs -> an `accelerate launch --config_file` YAML (DeepSpeed plugin pointing at the deepspeed export)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from tuner.interop.export.deepspeed import check_batch, validate_knobs

DEFAULT_DS_FILE = "ds_config.json"
_MIXED = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


def to_accelerate(
    knobs: Mapping[str, Any],
    *,
    world_size: int,
    gradient_accumulation_steps: int,
    baseline: Mapping[str, Any] | None = None,
    deepspeed_config_file: str = DEFAULT_DS_FILE,
) -> dict[str, Any]:
    """The accelerate config (ClusterConfig fields) for ``knobs``.

    A DeepSpeed run points ``deepspeed_config.deepspeed_config_file`` at the deepspeed export (bucket sizes,
    overlap_comm and the rest have no accelerate-config spelling, and accelerate forbids mixing a config file with
    its own zero_stage/offload keys). ``tuner export --format accelerate -o FILE`` writes that JSON next to FILE.
    ``baseline`` is accepted for a uniform signature; it only shapes the DeepSpeed JSON.
    """
    k = validate_knobs(knobs)
    check_batch(world_size, gradient_accumulation_steps)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": "NO",
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": 1,
        "num_processes": world_size,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if k.engine == "deepspeed":
        # no mixed_precision key: with a deepspeed_config_file accelerate refuses one (the JSON's bf16/fp16 rule)
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = {
            "deepspeed_config_file": deepspeed_config_file,
            "deepspeed_multinode_launcher": "standard",
            "zero3_init_flag": k.zero_stage == 3,
        }
    else:
        config["mixed_precision"] = _MIXED[k.precision]
        if world_size > 1:
            config["distributed_type"] = "MULTI_GPU"
    return config


def render_yaml(config: Mapping[str, Any], deepspeed_config_file: str = DEFAULT_DS_FILE) -> str:
    header = "# accelerate launch --config_file THIS_FILE train.py   (written by `tuner export`)\n"
    if "deepspeed_config" in config:
        header += (
            f"# needs the DeepSpeed JSON at {deepspeed_config_file}: "
            f"tuner export --format deepspeed -o {deepspeed_config_file}\n"
        )
    return header + yaml.safe_dump(dict(config), sort_keys=True)
