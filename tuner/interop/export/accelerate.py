"""Knobs -> an `accelerate launch --config_file` YAML: the DeepSpeed plugin pointing at the deepspeed export, or
FSDP2 (``distributed_type: FSDP``, ``fsdp_config`` with ``fsdp_version: 2`` and every tuned key explicit)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from trials.contract import FsdpSettings
from tuner.interop.export.deepspeed import check_batch, validate_knobs
from tuner.interop.export.fsdp import accelerate_block, held
from tuner.interop.export.nodes import accelerate_header, machines_block, parallelism_block
from tuner.interop.fsdp_names import PRECISION_MIXED

DEFAULT_DS_FILE = "ds_config.json"
# the engine-specific sections a config holds (replaced by the exported engine's)
_ENGINE_KEYS = ("deepspeed_config", "fsdp_config", "mixed_precision")
# the keys of their deepspeed_config block that say only where the launcher starts the processes (kept as written)
_DS_LAUNCHER = (
    "deepspeed_hostfile",
    "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter",
    "deepspeed_multinode_launcher",
)


def to_accelerate(
    knobs: Mapping[str, Any],
    *,
    world_size: int,
    gradient_accumulation_steps: int,
    baseline: Mapping[str, Any] | None = None,
    deepspeed_config_file: str = DEFAULT_DS_FILE,
    fsdp: FsdpSettings | Mapping[str, Any] | None = None,
    given: Mapping[str, Any] | None = None,
    nnodes: int = 1,
) -> dict[str, Any]:
    """The accelerate config (ClusterConfig fields) for ``knobs``: ``given`` (the user's own accelerate config) with
    its world size, engine and precision set, or accelerate's local-machine defaults.

    A DeepSpeed run points ``deepspeed_config.deepspeed_config_file`` at the deepspeed export (bucket sizes,
    overlap_comm and the rest have no accelerate-config spelling, and accelerate forbids mixing a config file with
    its own zero_stage/offload keys). ``tuner export --format accelerate -o FILE`` writes that JSON next to FILE.
    An FSDP2 run is ``distributed_type: FSDP`` with its ``fsdp_config`` (tuner.interop.export.fsdp: the tuned knobs
    and ``fsdp``, the user's held FSDP2 settings) and its mixed precision. ``baseline`` is accepted for a uniform
    signature; it only shapes the DeepSpeed JSON. Across ``nnodes`` machines the config names them and the c10d
    rendezvous (tuner.interop.export.nodes), and an HSDP pick its parallelism config.
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
    if given is not None:  # their file: only the engine, world size and precision change
        config = {key: value for key, value in given.items() if key not in _ENGINE_KEYS}
    config["num_processes"] = world_size
    config.update(machines_block(nnodes, given))
    if k.engine == "deepspeed":
        # no mixed_precision key: with a deepspeed_config_file accelerate refuses one (the JSON's bf16/fp16 rule)
        config["distributed_type"] = "DEEPSPEED"
        theirs = (given or {}).get("deepspeed_config")
        launcher = {key: v for key, v in theirs.items() if key in _DS_LAUNCHER} if isinstance(theirs, Mapping) else {}
        config["deepspeed_config"] = {
            "deepspeed_config_file": deepspeed_config_file,
            "deepspeed_multinode_launcher": "standard",
            **launcher,  # their launcher's own (a hostfile, filters): where the processes start, kept
            "zero3_init_flag": k.zero_stage == 3,
        }
    elif k.engine == "fsdp2":
        config["distributed_type"] = "FSDP"
        config["mixed_precision"] = PRECISION_MIXED[k.precision]
        config["fsdp_config"] = accelerate_block(k, held(fsdp), (given or {}).get("fsdp_config"))
        hsdp = parallelism_block(k, world_size)
        if hsdp:
            config["parallelism_config"] = hsdp
    else:
        config["mixed_precision"] = PRECISION_MIXED[k.precision]
        config["distributed_type"] = "MULTI_GPU" if world_size > 1 else "NO"
    return config


def render_yaml(config: Mapping[str, Any], deepspeed_config_file: str = DEFAULT_DS_FILE) -> str:
    header = "# accelerate launch --config_file THIS_FILE train.py   (written by `tuner export`)\n"
    header += accelerate_header(int(config.get("num_machines") or 1))
    if "deepspeed_config" in config:
        header += (
            f"# needs the DeepSpeed JSON at {deepspeed_config_file}: "
            f"tuner export --format deepspeed -o {deepspeed_config_file}\n"
        )
    if config.get("distributed_type") == "FSDP":
        header += "# FSDP2 (fully_shard) as tuner probed it: every tuned fsdp_config key is set explicitly\n"
    return header + yaml.safe_dump(dict(config), sort_keys=True)
