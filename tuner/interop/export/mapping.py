"""The one table between the flat knob names (trials.contract.Knobs) and each tool's spelling.

Export (knobs -> DeepSpeed JSON / TrainingArguments) and baseline import (DeepSpeed JSON / TrainingArguments -> knobs)
both read these tables, so a knob is spelled in exactly one place. Pure data and small helpers: no torch import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# defined with the probe contract (the probe resolves what an export leaves "auto"); re-exported for the exports
from trials.contract import AUTO as AUTO
from trials.contract import auto_paths as auto_paths


@dataclass(frozen=True)
class DsField:
    """A knob stored at ``path`` of the DeepSpeed JSON. ``min_stage``: written only for ZeRO stage >= this."""

    knob: str
    path: tuple[str, ...]
    min_stage: int = 0

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


# Knob -> DeepSpeed JSON path. precision and offload_optimizer need a value transform (see encode_* below).
DS_FIELDS: tuple[DsField, ...] = (
    DsField("micro_batch_size", ("train_micro_batch_size_per_gpu",)),
    DsField("zero_stage", ("zero_optimization", "stage")),
    DsField("allgather_bucket_size", ("zero_optimization", "allgather_bucket_size"), min_stage=1),
    DsField("reduce_bucket_size", ("zero_optimization", "reduce_bucket_size"), min_stage=1),
    DsField("overlap_comm", ("zero_optimization", "overlap_comm"), min_stage=1),
    DsField("contiguous_gradients", ("zero_optimization", "contiguous_gradients"), min_stage=1),
    DsField("offload_optimizer", ("zero_optimization", "offload_optimizer"), min_stage=1),
    DsField("offload_param", ("zero_optimization", "offload_param"), min_stage=3),  # ZeRO-3's parameter offload
    # ZeRO++ (ZeRO-3 only; written only where set: unset is DeepSpeed's default, no ZeRO++)
    DsField("zero_hpz_partition_size", ("zero_optimization", "zero_hpz_partition_size"), min_stage=3),
    DsField("zero_quantized_weights", ("zero_optimization", "zero_quantized_weights"), min_stage=3),
    DsField("zero_quantized_gradients", ("zero_optimization", "zero_quantized_gradients"), min_stage=3),
)
DS_PATH: dict[str, tuple[str, ...]] = {f.knob: f.path for f in DS_FIELDS}
# DeepSpeed's legacy spellings of optimizer / parameter offload to the CPU (booleans), read by the baseline import,
# never written
DS_LEGACY_CPU_OFFLOAD: tuple[str, ...] = ("zero_optimization", "cpu_offload")
DS_LEGACY_CPU_OFFLOAD_PARAM: tuple[str, ...] = ("zero_optimization", "cpu_offload_param")
# precision is two blocks: {"bf16": {"enabled": ...}, "fp16": {"enabled": ...}}
PRECISION_BLOCKS: dict[str, str] = {"bf16": "bf16", "fp16": "fp16"}
# The batch fields DeepSpeed checks against each other: train_batch_size = micro x accumulation x world size.
DS_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

# Knob -> (Seq2Seq)TrainingArguments keyword. precision maps to the bf16/fp16 booleans.
HF_ARGS: dict[str, str] = {
    "micro_batch_size": "per_device_train_batch_size",
    "eval_batch_size": "per_device_eval_batch_size",
    # transformers 5 renamed it activation_checkpointing (this name warns, gone in v6): the exports write the name of
    # the installed version (tuner.interop.export.own.checkpointing_key); the baseline import reads both.
    "gradient_checkpointing": "gradient_checkpointing",
    "generate": "predict_with_generate",
}
# Where training args may say gradient checkpointing, the first present wins: transformers 5's name, the older one.
HF_CHECKPOINTING_KEYS: tuple[str, ...] = ("activation_checkpointing", HF_ARGS["gradient_checkpointing"])
# DeepSpeed fields the HF Trainer fills from (and checks against) TrainingArguments: DeepSpeed path -> HF key(s).
HF_DS_FILL: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("gradient_clipping",), ("max_grad_norm",)),
    (("optimizer", "params", "lr"), ("learning_rate",)),
    (("optimizer", "params", "betas"), ("adam_beta1", "adam_beta2")),
    (("optimizer", "params", "eps"), ("adam_epsilon",)),
    (("optimizer", "params", "weight_decay"), ("weight_decay",)),
    (("scheduler", "params", "warmup_max_lr"), ("learning_rate",)),
    (("scheduler", "params", "warmup_num_steps"), ("warmup_steps",)),
    (("scheduler", "params", "total_num_steps"), ("max_steps",)),  # the Trainer's num_training_steps
)
# Where a training-args JSON (HfArgumentParser style, often mixed with the script's data arguments) says how long a
# sample may be; the first one present wins. The probe pads encoder input and labels to this length (worst case).

# TrainingArguments defaults the HF Trainer uses when a training-args JSON leaves a field out (transformers 5.x;
# tests/tuner/interop/test_baseline.py checks them against the installed transformers).
HF_DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "per_device_eval_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "max_grad_norm": 1.0,
    "learning_rate": 5e-05,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-08,
    "weight_decay": 0.0,
    "fp16": False,
    "bf16": False,
    "fp16_full_eval": False,
    "bf16_full_eval": False,
    "predict_with_generate": False,
    "max_steps": -1,
    "warmup_steps": 0,
    "logging_steps": 500,
}

# Every key DeepSpeed's ZeRO config (DeepSpeedZeroConfig, 0.19) accepts, field names and their stage3_* aliases, plus
# the legacy cpu_offload* spellings. DeepSpeed rejects any other key; so does the baseline import, before probing.
ZERO_KEYS: frozenset[str] = frozenset(
    {
        "stage",
        "contiguous_gradients",
        "reduce_scatter",
        "reduce_bucket_size",
        "use_multi_rank_bucket_allreduce",
        "allgather_partitions",
        "allgather_bucket_size",
        "overlap_comm",
        "load_from_fp32_weights",
        "elastic_checkpoint",
        "offload_param",
        "offload_optimizer",
        "sub_group_size",
        "cpu_offload_param",
        "cpu_offload_use_pin_memory",
        "cpu_offload",
        "prefetch_bucket_size",
        "stage3_prefetch_bucket_size",
        "param_persistence_threshold",
        "stage3_param_persistence_threshold",
        "model_persistence_threshold",
        "stage3_model_persistence_threshold",
        "max_live_parameters",
        "stage3_max_live_parameters",
        "max_reuse_distance",
        "stage3_max_reuse_distance",
        "gather_16bit_weights_on_model_save",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "module_granularity_threshold",
        "stage3_module_granularity_threshold",
        "use_all_reduce_for_fetch_params",
        "stage3_use_all_reduce_for_fetch_params",
        "allgather_sequential",
        "stage3_allgather_sequential",
        "ignore_unused_parameters",
        "legacy_stage1",
        "round_robin_gradients",
        "zero_hpz_partition_size",
        "zero_quantized_weights",
        "zero_quantized_nontrainable_weights",
        "zero_quantized_gradients",
        "memory_efficient_linear",
        "pipeline_loading_checkpoint",
        "override_module_apply",
        "log_trace_cache_warnings",
        "enable_sanity_checks",
        "compute_grad_norm",
        "leaf_module",
        "parameter_alignment",
        "save_muon_momentum_buffer_in_memory",
        "zenflow",
    }
)
# The top-level DeepSpeed keys the tuner reads or rewrites; a near-miss spelling of one of them is a typo that would
# silently change memory use (DeepSpeed ignores unknown top-level keys), so the baseline import rejects it.
DS_KNOWN_TOP: frozenset[str] = frozenset(
    {*DS_BATCH_KEYS, "zero_optimization", "bf16", "bfloat16", "fp16", "optimizer", "scheduler", "gradient_clipping"}
)


def encode_offload(enabled: bool) -> dict[str, Any]:
    return {"device": "cpu", "pin_memory": True} if enabled else {"device": "none"}


def decode_offload(ds: Mapping[str, Any]) -> bool:
    """Whether a DeepSpeed JSON offloads the optimizer to the CPU (encode_offload's block, or the legacy boolean)."""
    return get_path(ds, (*DS_PATH["offload_optimizer"], "device")) == "cpu" or bool(get_path(ds, DS_LEGACY_CPU_OFFLOAD))


def decode_offload_param(ds: Mapping[str, Any]) -> bool:
    """Whether a ZeRO-3 DeepSpeed JSON offloads the parameters to the CPU (its block, or the legacy boolean)."""
    device = get_path(ds, (*DS_PATH["offload_param"], "device"))
    return device == "cpu" or bool(get_path(ds, DS_LEGACY_CPU_OFFLOAD_PARAM))


def decode_precision(ds: Mapping[str, Any]) -> str:
    """The precision a DeepSpeed JSON's blocks enable (bf16 before fp16, as the blocks are listed), fp32 when none."""
    enabled = (name for name, block in PRECISION_BLOCKS.items() if get_path(ds, (block, "enabled")) is True)
    return next(enabled, "fp32")


def precision_blocks(precision: str, base: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The bf16 and fp16 blocks for ``precision``; the baseline's own block options (loss scaling ...) are kept, and a
    switched-off block the user's file does not have is not added (their file, only what was tuned changed)."""
    base = base or {}
    out: dict[str, dict[str, Any]] = {}
    for name, block in PRECISION_BLOCKS.items():
        if precision != name and base and block not in base:
            continue  # a user's file without this block: switched off already, nothing to add
        kept = dict(base.get(block) or {}) if precision == name else {}
        kept.pop("enabled", None)
        out[block] = {"enabled": precision == name, **kept}
    return out


def get_path(tree: Mapping[str, Any], path: Iterable[str]) -> Any:
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
