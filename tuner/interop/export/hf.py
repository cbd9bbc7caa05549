"""Knobs -> keyword arguments of transformers.(Seq2Seq)TrainingArguments, with the DeepSpeed section inline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trials.contract import FsdpSettings
from tuner.interop.export.deepspeed import to_deepspeed, validate_knobs
from tuner.interop.export.fsdp import held
from tuner.interop.export.mapping import AUTO, DS_BATCH_KEYS, HF_ARGS, HF_DS_FILL, get_path, set_path
from tuner.interop.export.own import checkpointing_key, fsdp_args


def to_hf(
    knobs: Mapping[str, Any],
    *,
    world_size: int,
    gradient_accumulation_steps: int,
    baseline: Mapping[str, Any] | None = None,
    transformers_version: str | None = None,
    fsdp: FsdpSettings | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """TrainingArguments kwargs for ``knobs``; ``Seq2SeqTrainingArguments(**to_hf(...), output_dir=...)`` builds.

    The kwargs are the single source of truth: inside the ``deepspeed`` dict the batch fields, the precision switches
    and every field the Trainer fills from its arguments (gradient clipping, optimizer lr/betas/eps/weight decay) are
    "auto", and the baseline's explicit values for those move into the kwargs (max_grad_norm, learning_rate ...), so
    the Trainer's "DeepSpeed config values that mismatch TrainingArguments" check can never fire. ``world_size`` is
    the launcher's business (the Trainer reads it from the process group); it only sizes the DeepSpeed section.
    ``max_length`` is not a TrainingArguments field: truncate the tokenizer to it (the json and env exports carry it).
    Gradient checkpointing is spelled as ``transformers_version`` expects it (tuner.interop.export.own). An FSDP2
    config is ``fsdp=True`` with its ``fsdp_config`` (tuner.interop.export.fsdp; ``fsdp``: the user's held FSDP2
    settings), checkpointing FSDP's own (``fsdp_config.activation_checkpointing``) and the training argument false:
    the Trainer refuses both.
    """
    k = validate_knobs(knobs)
    kwargs: dict[str, Any] = {
        HF_ARGS["micro_batch_size"]: k.micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        checkpointing_key(transformers_version): k.gradient_checkpointing,
        "bf16": k.precision == "bf16",
        "fp16": k.precision == "fp16",
        # the probed eval batch; for a job without an eval step the train micro batch, never the Trainer's default 8
        # behind the user's back (a no-grad forward at the micro batch holds less than the probed training step)
        HF_ARGS["eval_batch_size"]: k.eval_batch_size or k.micro_batch_size,
    }
    if k.generate:
        kwargs[HF_ARGS["generate"]] = True  # a Seq2SeqTrainingArguments field
    if k.engine == "fsdp2":
        return {**kwargs, **fsdp_args(k, held(fsdp), None, transformers_version)}
    if k.engine != "deepspeed":
        return kwargs
    ds = to_deepspeed(
        k.model_dump(),
        world_size=world_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        baseline=baseline,
        allow_auto=True,
    )
    kwargs["deepspeed"] = _trainer_filled(ds, kwargs)
    return kwargs


def _trainer_filled(ds: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed section with "auto" wherever the Trainer fills it from the kwargs, the baseline's explicit values
    for those moved into ``kwargs``."""
    for key in DS_BATCH_KEYS:
        ds[key] = AUTO
    for block in ("bf16", "fp16"):
        ds[block] = {**ds.get(block, {}), "enabled": AUTO}
    for path, hf_keys in HF_DS_FILL:
        value = get_path(ds, path)
        if value is None:
            continue
        if value != AUTO:
            if len(hf_keys) == 2 and isinstance(value, (list, tuple)) and len(value) == 2:
                kwargs.setdefault(hf_keys[0], value[0])
                kwargs.setdefault(hf_keys[1], value[1])
            elif len(hf_keys) == 1:
                kwargs.setdefault(hf_keys[0], value)
            else:
                continue  # a shape the Trainer would not fill either: leave it as the user wrote it
        set_path(ds, path, AUTO)
    return ds
