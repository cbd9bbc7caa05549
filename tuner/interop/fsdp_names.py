"""The one table between tuner's FSDP2 names (trials.contract.Knobs' FSDP knobs, FsdpSettings' fields) and the two
places a user writes FSDP2 settings, read from the installed accelerate (1.16) and transformers (5.25):

- accelerate's config file: ``distributed_type: FSDP`` and an ``fsdp_config`` block of ``fsdp_``-prefixed keys, which
  `accelerate launch` turns into ``FSDP_*`` variables (accelerate.utils.launch.prepare_multi_gpu_env) that
  ``FullyShardedDataParallelPlugin()`` reads in the training process;
- TrainingArguments' ``fsdp`` / ``fsdp_config`` (unprefixed keys; a ``fsdp_`` prefix is stripped), which
  ``TrainingArguments._process_fsdp_args`` turns into the plugin's keyword arguments (``fsdp_plugin_args``).

The baseline import (tuner.interop.baseline_fsdp) and the exports (tuner.interop.export.fsdp) both read these tables,
so a key is spelled in one place; tests/tuner/interop/test_fsdp_names.py checks them against the installed packages.
Pure data: no torch import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from trials.contract import FsdpWrap


@dataclass(frozen=True)
class FsdpKey:
    """One FSDP2 setting: tuner's name (a Knobs field when ``tuned``, else an FsdpSettings field) and its spellings."""

    name: str
    accelerate: str  # the accelerate config's fsdp_config key
    trainer: str  # TrainingArguments' fsdp_config key
    env: str  # the variable `accelerate launch` sets from it (FullyShardedDataParallelPlugin reads it)
    tuned: bool = False


# The knobs the search tunes, then the user's settings a search holds (tuner.interop.baseline_fsdp imports them).
FSDP_KEYS: tuple[FsdpKey, ...] = (
    FsdpKey(
        "reshard_after_forward",
        "fsdp_reshard_after_forward",
        "reshard_after_forward",
        "FSDP_RESHARD_AFTER_FORWARD",
        True,
    ),
    FsdpKey("offload_params", "fsdp_offload_params", "cpu_offload", "FSDP_OFFLOAD_PARAMS", True),
    # under FSDP, gradient checkpointing is accelerate's own activation checkpointing (fsdp2_apply_ac)
    FsdpKey(
        "gradient_checkpointing",
        "fsdp_activation_checkpointing",
        "activation_checkpointing",
        "FSDP_ACTIVATION_CHECKPOINTING",
        True,
    ),
    FsdpKey("auto_wrap_policy", "fsdp_auto_wrap_policy", "auto_wrap_policy", "FSDP_AUTO_WRAP_POLICY"),
    FsdpKey(
        "transformer_layer_cls_to_wrap",
        "fsdp_transformer_layer_cls_to_wrap",
        "transformer_layer_cls_to_wrap",
        "FSDP_TRANSFORMER_CLS_TO_WRAP",
    ),
    FsdpKey("min_num_params", "fsdp_min_num_params", "min_num_params", "FSDP_MIN_NUM_PARAMS"),
    FsdpKey("state_dict_type", "fsdp_state_dict_type", "state_dict_type", "FSDP_STATE_DICT_TYPE"),
    FsdpKey(
        "cpu_ram_efficient_loading",
        "fsdp_cpu_ram_efficient_loading",
        "cpu_ram_efficient_loading",
        "FSDP_CPU_RAM_EFFICIENT_LOADING",
    ),
)
VERSION = FsdpKey("version", "fsdp_version", "version", "FSDP_VERSION")
KEY: dict[str, FsdpKey] = {k.name: k for k in FSDP_KEYS}
# `accelerate launch` sets this for an FSDP config: Accelerator() then builds its plugin from the FSDP_* variables
USE_FSDP_ENV = "ACCELERATE_USE_FSDP"
TRAINER_PREFIX = "fsdp_"  # TrainingArguments strips it from fsdp_config keys

# What runs when a key is left out. accelerate: the launcher's argument defaults, then the plugin's FSDP2 defaults
# (no fsdp_auto_wrap_policy: NO_WRAP; no fsdp_version: 1). transformers 5.25: _process_fsdp_args' defaults.
ACCELERATE_DEFAULTS: dict[str, Any] = {
    "version": 1,
    "reshard_after_forward": True,
    "offload_params": False,
    "gradient_checkpointing": False,
    "auto_wrap_policy": "NO_WRAP",
    "transformer_layer_cls_to_wrap": (),
    "min_num_params": 100_000_000,
    "state_dict_type": "SHARDED_STATE_DICT",
    "cpu_ram_efficient_loading": True,
}
TRAINER_DEFAULTS: dict[str, Any] = {
    "version": 2,
    "reshard_after_forward": True,
    "offload_params": False,
    "gradient_checkpointing": False,
    "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "transformer_layer_cls_to_wrap": (),
    "min_num_params": 0,
    "state_dict_type": "FULL_STATE_DICT",
    "cpu_ram_efficient_loading": False,
}

WRAP_POLICIES: tuple[str, ...] = get_args(FsdpWrap)  # accelerate's FSDP_AUTO_WRAP_POLICY
STATE_DICT_TYPES: tuple[str, ...] = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")  # FSDP2 refuses LOCAL_STATE_DICT
# accelerate's mixed_precision -> tuner's precision (fp8 is not probed)
MIXED_PRECISION: dict[str, str] = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}
PRECISION_MIXED: dict[str, str] = {v: k for k, v in MIXED_PRECISION.items()}

# FSDP1 keys FSDP2 no longer reads: accepted and carried in the user's file (accelerate warns and drops them;
# `accelerate to-fsdp2` marks them REMOVED).
ACCELERATE_OBSOLETE: frozenset[str] = frozenset(
    {"fsdp_backward_prefetch", "fsdp_use_orig_params", "fsdp_sync_module_states"}
)
TRAINER_OBSOLETE: frozenset[str] = frozenset(
    {"backward_prefetch", "use_orig_params", "sync_module_states", "limit_all_gathers"}
)
# TrainingArguments' XLA keys: accepted while ``xla`` is false (the XLA path is not FSDP2)
TRAINER_XLA: frozenset[str] = frozenset({"xla", "xla_fsdp_settings", "xla_fsdp_grad_ckpt", "xla_fsdp_v2"})

# Keys refused under FSDP2 (unprefixed name -> why, and the fix). accelerate's FullyShardedDataParallelPlugin raises
# on forward_prefetch with fsdp_version 2, while its launcher and the Trainer drop the key without a word: the user
# would believe they prefetch. sharding_strategy is FSDP1's (the launcher drops it under FSDP2). The others change
# what is sharded or kept, and tuner's FSDP2 probe does not run them yet.
REFUSED: dict[str, str] = {
    "forward_prefetch": "accelerate does not implement forward prefetch under FSDP2 (its plugin raises "
    "'forward_prefetch is not yet implemented in FSDP2'; the launcher and the Trainer drop the key silently); "
    "remove it",
    "sharding_strategy": "is FSDP1's sharding strategy, dropped under FSDP2; write reshard_after_forward: true "
    "(FULL_SHARD) or false (SHARD_GRAD_OP) instead",
    "ignored_modules": "leaves modules unsharded, which tuner's FSDP2 probe does not run yet; remove it to search "
    "without it",
    "activation_checkpointing_offload": "offloads checkpointed activations to the host, which tuner's FSDP2 probe "
    "does not run yet; set it false or remove it to search without it",
}
# refused only when set (a false / empty value asks for nothing FSDP2 lacks)
REFUSED_WHEN_SET: frozenset[str] = frozenset({"ignored_modules", "activation_checkpointing_offload"})

ACCELERATE_KNOWN: frozenset[str] = frozenset(
    {VERSION.accelerate, *(k.accelerate for k in FSDP_KEYS), *ACCELERATE_OBSOLETE, *(f"fsdp_{k}" for k in REFUSED)}
)
TRAINER_KNOWN: frozenset[str] = frozenset(
    {VERSION.trainer, *(k.trainer for k in FSDP_KEYS), *TRAINER_OBSOLETE, *TRAINER_XLA}
    | {"forward_prefetch", "sharding_strategy"}
)


def unprefixed(key: str) -> str:
    return key[len(TRAINER_PREFIX) :] if key.startswith(TRAINER_PREFIX) else key
