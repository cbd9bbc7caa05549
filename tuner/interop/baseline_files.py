"""The user's baseline files: read (one clear line for an unreadable or non-object JSON), told apart (a DeepSpeed
config or training args, by their keys), and parsed by tuner.interop.baseline.parse_baseline. A training-args file's
``deepspeed`` path is read relative to that file."""

from __future__ import annotations

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


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in the regular file ``path`` (a few MiB at most, nesting and size bounded: tuner.bounded)."""
    text = read_text_file(Path(path), what, error=BaselineError)
    data = loads_json(text, f"{what} {str(path)!r}", error=BaselineError)
    if not isinstance(data, dict):
        raise BaselineError(f"the {what} {str(path)!r} must hold a JSON object, got {type(data).__name__}")
    return data


def file_kind(data: Mapping[str, Any]) -> str:
    """'deepspeed' or 'hf' for a lone baseline file."""
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
    """Reads a baseline from ``path`` (a DeepSpeed JSON or a training-args JSON, told apart by their keys) and an
    optional second training-args file. A training-args ``deepspeed`` path is read relative to its file; "auto" is
    filled as ``transformers_version``'s Trainer fills it (None: this host's)."""
    first = read_json(path, "baseline file")
    ds: dict[str, Any] | None = None
    hf: dict[str, Any] | None = None
    hf_path: Path | None = None
    if file_kind(first) == "deepspeed":
        ds = first
    else:
        hf, hf_path = first, Path(path)
    if training_args is not None:
        if hf is not None:
            raise BaselineError("two training-args files given; pass one DeepSpeed JSON and one training-args JSON")
        hf, hf_path = read_json(training_args, "training-args file"), Path(training_args)
    if hf is not None and ds is None and isinstance(hf.get("deepspeed"), str) and hf_path is not None:
        ds_path = Path(hf["deepspeed"])
        ds = read_json(ds_path if ds_path.is_absolute() else hf_path.parent / ds_path, "DeepSpeed config")
    return parse_baseline(
        ds,
        hf,
        world_size=world_size,
        hidden_size=hidden_size,
        max_length=max_length,
        transformers_version=transformers_version,
    )
