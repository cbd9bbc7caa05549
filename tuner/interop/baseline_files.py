"""The user's baseline files: read (one clear line for an unreadable or non-object JSON / YAML), told apart (a DeepSpeed
config, training args or an accelerate config, by their keys), and parsed by tuner.interop.baseline.parse_baseline. A
training-args file's ``deepspeed`` / ``fsdp_config`` path is read relative to that file."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.bounded import loads_json, read_text_file
from tuner.errors import BaselineError
from tuner.interop.baseline import Baseline, parse_baseline
from tuner.job.definition import HF_MAX_LENGTH_KEYS

# Keys that only a DeepSpeed config has / only a training-args JSON has (to tell a lone file's kind).
DS_ONLY = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "zero_optimization",
    "optimizer",
    "scheduler",
    "gradient_clipping",
    "steps_per_print",
    "wall_clock_breakdown",
    "bfloat16",
}
HF_ONLY = {
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "output_dir",
    "deepspeed",
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "predict_with_generate",
    "gradient_checkpointing",
    "logging_steps",
    "eval_strategy",
    "save_strategy",
    "max_grad_norm",
    "warmup_steps",
    *HF_MAX_LENGTH_KEYS,
}


YAML_SUFFIXES = (".yaml", ".yml")  # an accelerate config (`accelerate config` writes YAML; JSON ones read as JSON)
# the key every accelerate config has (accelerate's load_config_from_file refuses one without it)
ACCELERATE_KEY = "distributed_type"


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in the regular file ``path`` (a few MiB at most, nesting and size bounded: tuner.bounded); a
    ``.yaml`` / ``.yml`` file is read as YAML (an accelerate config), bounded the same way."""
    text = read_text_file(Path(path), what, error=BaselineError)
    if Path(path).suffix.lower() in YAML_SUFFIXES:
        data = _loads_yaml(text, f"{what} {str(path)!r}")
    else:
        data = loads_json(text, f"{what} {str(path)!r}", error=BaselineError)
    if not isinstance(data, dict):
        raise BaselineError(f"the {what} {str(path)!r} must hold a JSON object, got {type(data).__name__}")
    return data


def _loads_yaml(text: str, what: str) -> Any:
    from tuner.bounded_yaml import loads_yaml  # aliases counted expanded, libyaml's parser (issue 42 §3)

    return loads_yaml(text, what, error=BaselineError)


def file_kind(data: Mapping[str, Any]) -> str:
    """'deepspeed', 'hf' or 'accelerate' (an accelerate config: it names its distributed_type) for a lone baseline
    file."""
    if ACCELERATE_KEY in data:
        return "accelerate"
    ds, hf = bool(DS_ONLY & set(data)), bool(HF_ONLY & set(data))
    if isinstance(data.get("fp16"), dict) or isinstance(data.get("bf16"), dict):
        ds = True
    if ds == hf:
        raise BaselineError(
            "cannot tell whether the baseline file is a DeepSpeed config or training args; "
            "pass the DeepSpeed JSON and the training-args JSON separately"
        )
    return "deepspeed" if ds else "hf"


def load_baseline(
    path: Path,
    training_args: Path | None = None,
    *,
    world_size: int | None = None,
    hidden_size: int | None = None,
    max_length: int | None = None,
    transformers_version: str | None = None,
) -> Baseline:
    """Reads a baseline from ``path`` (a DeepSpeed JSON, a training-args JSON or an accelerate config, told apart by
    their keys) and an optional second training-args file. A training-args ``deepspeed`` or ``fsdp_config`` path is
    read relative to its file; "auto" is filled as ``transformers_version``'s Trainer fills it (None: this host's)."""
    first = read_json(path, "baseline file")
    ds: dict[str, Any] | None = None
    hf: dict[str, Any] | None = None
    accelerate: dict[str, Any] | None = None
    hf_path: Path | None = None
    kind = file_kind(first)
    if kind == "deepspeed":
        ds = first
    elif kind == "accelerate":
        accelerate = first
    else:
        hf, hf_path = first, Path(path)
    if training_args is not None:
        if hf is not None:
            raise BaselineError("two training-args files given; pass one DeepSpeed JSON and one training-args JSON")
        hf, hf_path = read_json(training_args, "training-args file"), Path(training_args)
    if hf is not None and hf_path is not None:
        hf = _named_files(hf, hf_path)
        if ds is None and isinstance(hf.get("deepspeed"), str):
            ds = read_json(_beside(hf_path, hf["deepspeed"]), "DeepSpeed config")
    base = parse_baseline(
        ds,
        hf,
        world_size=world_size,
        hidden_size=hidden_size,
        max_length=max_length,
        transformers_version=transformers_version,
        accelerate=accelerate,
    )
    yaml_args = hf_path is not None and hf_path.suffix.lower() in YAML_SUFFIXES  # a TRL recipe's YAML, written back
    return dataclasses.replace(base, args_yaml=True) if yaml_args else base


def _beside(args_path: Path, named: str) -> Path:
    """A file the training args name, read relative to the training-args file (as their script's working copy)."""
    found = Path(named)
    return found if found.is_absolute() else args_path.parent / found


def _named_files(hf: dict[str, Any], hf_path: Path) -> dict[str, Any]:
    """The training args with the FSDP config file they name (``fsdp_config: PATH``, as TrainingArguments opens it)
    read in: the exports write it back inline."""
    named = hf.get("fsdp_config")
    if not isinstance(named, str):
        return hf
    return {**hf, "fsdp_config": read_json(_beside(hf_path, named), "FSDP config")}
