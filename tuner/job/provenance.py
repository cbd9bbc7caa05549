"""Where each held value of the job comes from: their file and key, an option, the data, or the library's default,
named. One line for the dry run and the search's header (issue 38: "say where each held value came from"). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tuner.job.definition import HF_EVAL_BATCH, HF_MAX_LENGTH_KEYS, Job, JobFlags
from tuner.job.evaluation import strategy_line
from tuner.job.ledger.trl import TRL_RELEASE, Recipe, read_recipe
from tuner.job.trl_head import head_line

ARGS = "training args"


@dataclass(frozen=True)
class Held:
    """What the job's values were read from (the request's inputs, before the job was resolved)."""

    flags: JobFlags
    hf_args: Mapping[str, Any] | None
    deepspeed: Mapping[str, Any] | None
    builtin: bool
    lengths: Mapping[str, str]  # tuner.job.data_job.length_sources, with data
    global_batch: str  # where the global batch comes from, in words
    world_size: str


def _precision(job: Job, h: Held) -> str:
    if h.flags.precision is not None:
        return "--precision"
    ds = h.deepspeed or {}
    for block in ("bf16", "fp16"):
        if isinstance(ds.get(block), Mapping) and ds[block].get("enabled") is True:
            return f"DeepSpeed {block}.enabled"
    args = h.hf_args or {}
    for key in ("bf16", "fp16"):
        if args.get(key):
            return f"{ARGS} {key}"
    recipe = _recipe(h)
    if recipe.defaults.get("bf16"):
        return f"TRL {TRL_RELEASE} {recipe.config}'s default: bf16 where fp16 is not set"
    if h.builtin:
        return "the preset's default"
    return "fp32: TrainingArguments' default (bf16 / fp16 false)"


def _length(h: Held) -> str:
    if h.lengths.get("max_length"):
        return h.lengths["max_length"]
    if h.flags.max_length is not None:
        return "--max-length"
    args = h.hf_args or {}
    key = next((k for k in HF_MAX_LENGTH_KEYS if args.get(k)), None)
    if key is not None:
        return f"{ARGS} {key}"
    recipe = _recipe(h)
    if recipe.kind is not None and "max_length" not in args:
        return f"TRL {TRL_RELEASE} {recipe.config}'s default max_length (TRL truncates there)"
    return "the preset's default" if h.builtin else "--max-length"


def _evaluation(job: Job, h: Held) -> str:
    if h.flags.eval_batch_size is not None or h.flags.generate is not None:
        return "--eval-batch-size / --generate"
    if h.hf_args is None:
        return "no training args: no eval step" if not job.evaluates else "the job flags"
    if not job.evaluates:
        return f"no eval step: {strategy_line(h.hf_args)}"
    size = (
        f"{ARGS} per_device_eval_batch_size"
        if "per_device_eval_batch_size" in h.hf_args
        else f"TrainingArguments' default per_device_eval_batch_size {HF_EVAL_BATCH}"
    )
    return f"{strategy_line(h.hf_args)}, at {size}"


def _optimizer(h: Held) -> str:
    ds = h.deepspeed or {}
    if isinstance(ds.get("optimizer"), Mapping):
        return f"DeepSpeed optimizer section ({ds['optimizer'].get('type')}; their optim is not read beside it)"
    args = h.hf_args or {}
    if args.get("optim"):
        return f"{ARGS} optim {args['optim']}"
    return "TrainingArguments' default optim (the Trainer's AdamW, fused where torch has it)"


def _recipe(h: Held) -> Recipe:
    try:
        return read_recipe(h.hf_args or {})
    except ValueError:  # refused before any line is printed
        return Recipe(None)


def sources_line(job: Job, held: Held) -> str:
    """One line: each held value and where it came from."""
    recipe = _recipe(held)
    if job.dpo is not None:  # the job's reference: the adapter disabled where --lora-* options make it LoRA too
        recipe = replace(recipe, reference=job.dpo.reference)
    lora = "; LoRA (your recipe's use_peft + lora_*, ModelConfig's defaults for the rest)" if recipe.peft else ""
    parts = [
        *([f"{recipe.line()}{lora}; {head_line(job.trl_head)}"] if recipe.kind else []),
        f"precision {job.precision} ({_precision(job, held)})",
        f"length {job.max_length} ({_length(held)})",
        f"evaluation ({_evaluation(job, held)})",
        f"optimizer ({_optimizer(held)})",
        f"global batch ({held.global_batch})",
        f"world size ({held.world_size})",
    ]
    return "where it comes from: " + "; ".join(parts)
