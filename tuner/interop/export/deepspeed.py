"""Knobs -> a full DeepSpeed JSON (what `deepspeed.initialize(config=...)` and `--deepspeed ds_config.json` take)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from trials.contract import BUCKET_KNOBS, DS_DEFAULT_BUCKET, ZERO_PP_KNOBS, Knobs
from tuner.errors import ConfigError
from tuner.interop.export.mapping import (
    AUTO,
    DS_BATCH_KEYS,
    DS_FIELDS,
    HF_DEFAULTS,
    DsField,
    auto_paths,
    encode_offload,
    precision_blocks,
    set_path,
)

# ZeRO keys whose "auto" the HF Trainer resolves from the model (trials.engine resolves them the same way)
_MODEL_SIZED = {"reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"}
# Keys of the baseline's zero_optimization that the tuned knobs replace (plus the legacy spelling of offload).
_TUNED_ZERO_KEYS = {f.path[-1] for f in DS_FIELDS if f.path[0] == "zero_optimization"}
_TUNED_ZERO_KEYS |= {"cpu_offload", "cpu_offload_param"}
_OFFLOADS = ("offload_optimizer", "offload_param")


def validate_knobs(knobs: Mapping[str, Any]) -> Knobs:
    """The knobs as a checked Knobs model; a ConfigError naming the field otherwise."""
    try:
        return Knobs.model_validate(dict(knobs))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "knobs"
        raise ConfigError(f"invalid knobs: {where}: {first['msg']}") from None


def trainer_adamw(training_args: Mapping[str, Any] | None) -> dict[str, Any]:
    """DeepSpeed's AdamW section with the hyperparameters the HF Trainer gives its own AdamW: the training args',
    else TrainingArguments' defaults (the numerics of the optimizer the job would otherwise run)."""
    given = {**HF_DEFAULTS, **dict(training_args or {})}
    return {
        "type": "AdamW",
        "params": {
            "lr": given["learning_rate"],
            "betas": [given["adam_beta1"], given["adam_beta2"]],
            "eps": given["adam_epsilon"],
            "weight_decay": given["weight_decay"],
        },
    }


def _unset_zero_pp(field: DsField, value: Any) -> bool:
    """A ZeRO++ knob left off: nothing written, DeepSpeed's default (what the probe ran)."""
    return field.knob in ZERO_PP_KNOBS and (value is None or value is False or (type(value) is int and value == 1))


def _zero_value(field: DsField, value: Any, base_zero: Mapping[str, Any]) -> Any:
    """The JSON value of one tuned ZeRO key, as the probe ran it (None: not written, DeepSpeed's default)."""
    if _unset_zero_pp(field, value):
        return None
    if field.knob in BUCKET_KNOBS and value is None:
        # the user's "auto" reduce bucket: the Trainer (and the probe, from the model) resolve it to hidden size²;
        # else DeepSpeed's default, what the probe runs with
        user_auto = field.path[-1] in _MODEL_SIZED and base_zero.get(field.path[-1]) == AUTO
        return AUTO if user_auto else DS_DEFAULT_BUCKET
    if field.knob in _OFFLOADS:  # the baseline's own offload options (pin_memory, ratio ...) stay
        found = base_zero.get(field.path[-1])
        own: dict[str, Any] = found if isinstance(found, dict) else {}
        if field.knob == "offload_param" and not value and not own:
            return None  # ZeRO-3 without parameter offload and no block of theirs
        return {**encode_offload(True), **own, "device": "cpu"} if value else encode_offload(False)
    return value


def check_batch(world_size: int, gradient_accumulation_steps: int) -> None:
    for name, value in (("world_size", world_size), ("gradient_accumulation_steps", gradient_accumulation_steps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def to_deepspeed(
    knobs: Mapping[str, Any],
    *,
    world_size: int,
    gradient_accumulation_steps: int,
    baseline: Mapping[str, Any] | None = None,
    allow_auto: bool = False,
    training_args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A complete DeepSpeed config for ``knobs`` at ``world_size`` ranks.

    ``baseline`` is the user's own DeepSpeed JSON (``Baseline.ds_config``): its optimizer, scheduler, gradient
    clipping, precision options and any other sections are kept; the batch fields, the ZeRO stage and the tuned ZeRO
    keys and the precision switch come from ``knobs``. With ``allow_auto`` False (the deepspeed format) any "auto"
    left in a kept section is a ConfigError; the HF Trainer fills those itself, so the hf/accelerate exports allow them.
    An offloading config whose baseline names no optimizer gets DeepSpeed's AdamW at the values the Trainer would
    give its own (``trainer_adamw``): ZeRO-Offload refuses a client optimizer. The probe runs this same JSON
    (trials.engine.probe_deepspeed_config).
    """
    k = validate_knobs(knobs)
    check_batch(world_size, gradient_accumulation_steps)
    base: dict[str, Any] = copy.deepcopy(dict(baseline or {}))
    for key in DS_BATCH_KEYS:
        base.pop(key, None)
    legacy_bf16 = base.pop("bfloat16", None)  # DeepSpeed's old spelling of the bf16 block
    if legacy_bf16 is not None and "bf16" not in base:
        base["bf16"] = legacy_bf16
    base_zero = dict(base.pop("zero_optimization", None) or {})

    out: dict[str, Any] = {
        "train_batch_size": k.micro_batch_size * gradient_accumulation_steps * world_size,
        "train_micro_batch_size_per_gpu": k.micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "gradient_clipping": base.pop("gradient_clipping", 1.0),
    }
    zero = {key: value for key, value in base_zero.items() if key not in _TUNED_ZERO_KEYS}
    for field in DS_FIELDS:
        if field.path[0] != "zero_optimization" or k.zero_stage < field.min_stage:
            continue
        value = _zero_value(field, getattr(k, field.knob), base_zero)
        if value is not None:
            set_path(out, field.path, value)
    out["zero_optimization"] = {
        "stage": k.zero_stage,
        **{key: v for key, v in out.get("zero_optimization", {}).items() if key != "stage"},
        **zero,
    }
    blocks = precision_blocks(k.precision, base)
    base.pop("bf16", None)
    base.pop("fp16", None)
    out.update(blocks)
    out.update(base)  # optimizer, scheduler, steps_per_print ... exactly as the user had them
    if k.offload_optimizer and "optimizer" not in out:
        out["optimizer"] = trainer_adamw(training_args)
    if not allow_auto:
        left = auto_paths(out)
        if left:
            raise ConfigError(
                f"the baseline DeepSpeed config leaves {', '.join(left)} as {AUTO!r} and nothing here resolves it "
                "(the HF Trainer fills it from the dataset size or the model); write a number there, give the "
                "training-args JSON (max_steps), or export --format hf, whose DeepSpeed section keeps 'auto'"
            )
    return out
