"""The export as the user's own files with only the tuned knobs changed.

A study with a baseline stores the user's files as given (``baseline_files``: their DeepSpeed JSON and their training
args). The deepspeed and hf exports then start from those files: every key they wrote stays, "auto" stays where they
wrote it and the HF Trainer fills it the same way from the exported training args, and only what the search tuned
(micro batch and accumulation, ZeRO stage and keys, offload, checkpointing, the eval batch) changes. Pure functions.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trials.contract import FsdpSettings, Knobs
from tuner.interop.export.fsdp import trainer_block
from tuner.interop.export.mapping import AUTO, DS_BATCH_KEYS, HF_DS_FILL, auto_paths, get_path, set_path
from tuner.interop.trainer_fill import TrainerFix, apply_fixes, parse_version

# DeepSpeed paths whose "auto" the Trainer fills from TrainingArguments (the exported ones: consistent by construction)
_TRAINER_FILLED: frozenset[tuple[str, ...]] = frozenset(
    {
        *((key,) for key in DS_BATCH_KEYS),
        ("bf16", "enabled"),
        ("fp16", "enabled"),
        ("scheduler", "params", "warmup_min_lr"),
        *(path for path, _ in HF_DS_FILL),
    }
)


@dataclass(frozen=True)
class UserFiles:
    """The user's baseline files as given (None: that file was not given)."""

    deepspeed: Mapping[str, Any] | None = None
    training_args: Mapping[str, Any] | None = None
    accelerate: Mapping[str, Any] | None = None  # their accelerate config (an FSDP2 baseline's)
    training_args_yaml: bool = False  # their training-args file was YAML (a TRL recipe's: the recipe export)

    @classmethod
    def of(cls, stored: Any) -> UserFiles | None:
        """From a study definition's ``baseline_files``; None for a study without a baseline (or stored before)."""
        if not isinstance(stored, Mapping):
            return None
        found = [stored.get(name) for name in ("deepspeed", "training_args", "accelerate")]
        deepspeed, args, accelerate = (part if isinstance(part, Mapping) else None for part in found)
        files = cls(deepspeed, args, accelerate, training_args_yaml=stored.get("training_args_format") == "yaml")
        given = (files.deepspeed, files.training_args, files.accelerate)
        return files if any(part is not None for part in given) else None


# the first transformers whose TrainingArguments has ``activation_checkpointing`` (5.0-5.22 and 4.x only know
# ``gradient_checkpointing``; from 5.23 it is a deprecated alias, gone in v6)
ACTIVATION_CHECKPOINTING_SINCE = (5, 23)


def checkpointing_key(transformers_version: str | None) -> str:
    """The TrainingArguments name of gradient checkpointing in ``transformers_version``: ``activation_checkpointing``
    from 5.23, ``gradient_checkpointing`` before (and when unknown: every version still accepts it)."""
    parsed = parse_version(transformers_version)
    if parsed is None:
        return "gradient_checkpointing"
    return "activation_checkpointing" if parsed >= ACTIVATION_CHECKPOINTING_SINCE else "gradient_checkpointing"


def own_deepspeed(
    tuned: Mapping[str, Any],
    given: Mapping[str, Any],
    resolved: Mapping[str, Any],
    fixes: Sequence[TrainerFix] = (),
) -> dict[str, Any]:
    """``tuned`` (to_deepspeed of the knobs on the user's ``resolved`` JSON) with "auto" back where the user's
    ``given`` JSON had it and the Trainer resolves it to the value probed: the TrainingArguments-filled fields always
    (the hf export carries their values), a model-sized one when the tuned value is what "auto" resolved to. The
    ``fixes`` for the user's Trainer (tuner.interop.trainer_fill) are written explicitly instead."""
    out = copy.deepcopy(dict(tuned))
    fixed = {f.key for f in fixes if f.file == "deepspeed"}
    for dotted in auto_paths(given):
        path = tuple(dotted.split("."))
        if get_path(out, path) is None or dotted in fixed:
            continue  # a key the tuned config dropped (e.g. a ZeRO key of a lower stage), or one the fix writes
        if path in _TRAINER_FILLED or get_path(out, path) == get_path(resolved, path):
            set_path(out, path, AUTO)
    return apply_fixes(out, list(fixes), "deepspeed")


def fsdp_args(
    knobs: Knobs, settings: FsdpSettings, given: Mapping[str, Any] | None, transformers_version: str | None
) -> dict[str, Any]:
    """The TrainingArguments fields of an FSDP2 config: ``fsdp`` on, its ``fsdp_config`` (``given``: the user's own
    block, kept but for the FSDP2 keys) and the training argument's checkpointing false, FSDP's own checkpointing
    being in the block (the Trainer refuses both on)."""
    block = given if isinstance(given, Mapping) else None
    return {
        "fsdp": True,
        "fsdp_config": trainer_block(knobs, settings, block),
        checkpointing_key(transformers_version): False,
    }


def own_training_args(
    given: Mapping[str, Any],
    knobs: Knobs,
    *,
    gradient_accumulation_steps: int,
    deepspeed: Mapping[str, Any] | None,
    transformers_version: str | None,
    fixes: Sequence[TrainerFix] = (),
    fsdp: FsdpSettings | None = None,
    fsdp_in_args: bool = True,
) -> dict[str, Any]:
    """The user's training args with the tuned values: micro batch, accumulation, checkpointing (under the name the
    installed transformers expects; the other spelling removed), the probed eval batch, the job's precision and
    predict_with_generate, ``deepspeed`` inline (the deepspeed export) or removed for a plain-PyTorch config, ``fsdp``
    and ``fsdp_config`` for an FSDP2 config (``fsdp``: the held FSDP2 settings; removed for another engine; not added
    without ``fsdp_in_args``, when their accelerate config carries them), and the ``fixes`` their Trainer needs
    (tuner.interop.trainer_fill). Every other key (their script's data arguments too) stays as they wrote it."""
    out = dict(given)
    out["per_device_train_batch_size"] = knobs.micro_batch_size
    out["gradient_accumulation_steps"] = gradient_accumulation_steps
    key = checkpointing_key(transformers_version)
    for name in ("gradient_checkpointing", "activation_checkpointing"):
        out.pop(name, None)
    out[key] = knobs.gradient_checkpointing
    out["per_device_eval_batch_size"] = knobs.eval_batch_size or knobs.micro_batch_size  # as to_hf writes it
    out["bf16"] = knobs.precision == "bf16"
    out["fp16"] = knobs.precision == "fp16"
    if knobs.generate or "predict_with_generate" in out:
        out["predict_with_generate"] = knobs.generate
    if deepspeed is not None:
        out["deepspeed"] = dict(deepspeed)
        out = apply_fixes(out, list(fixes), "training args")
    else:
        out.pop("deepspeed", None)
    if knobs.engine == "fsdp2":
        found = fsdp_args(knobs, fsdp or FsdpSettings(), given.get("fsdp_config"), transformers_version)
        out.update(found if fsdp_in_args else {key: found[key]})  # FSDP's checkpointing: the argument false
    else:
        out.pop("fsdp", None)
        out.pop("fsdp_config", None)
    return out
