"""Validates a --model source without importing torch: a built-in preset, a local save_pretrained dir, or an HF id."""

from __future__ import annotations

import re
from pathlib import Path

from trials import contract
from trials.contract import BUILTIN_PREFIX, ModelSpec
from tuner.errors import ModelSourceError
from tuner.job.own_code import refuse_own_code

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def builtin_presets() -> list[str]:
    """Preset names from trials.contract.BUILTIN_PRESETS (a list or a mapping of name -> config)."""
    presets = getattr(contract, "BUILTIN_PRESETS", None)
    if presets is None:
        return ["tiny-t5"]
    return sorted(presets)


def _looks_like_path(source: str) -> bool:
    return source.startswith(("/", "./", "../", "~")) or source in (".", "..") or "\\" in source


def resolve_model(source: str) -> ModelSpec:
    """The ModelSpec for ``source``; a ModelSourceError naming the fix when it cannot be a model."""
    source = source.strip()
    if not source:
        raise ModelSourceError("--model is empty; give builtin:tiny-t5, an HF model id, or a local model directory")
    if source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX) :]
        presets = builtin_presets()
        if name not in presets:
            raise ModelSourceError(
                f"unknown built-in model {source!r}; choose one of {', '.join(BUILTIN_PREFIX + p for p in presets)}"
            )
        return ModelSpec(source=source)
    path = Path(source).expanduser()
    if path.exists() or _looks_like_path(source):
        if not path.is_dir():
            raise ModelSourceError(
                f"model path {source} does not exist or is not a directory; give a save_pretrained directory"
            )
        if not (path / "config.json").is_file():
            raise ModelSourceError(
                f"model directory {source} holds no config.json; save the model with save_pretrained"
            )
        refuse_own_code(source, "model directory", ModelSourceError)
        return ModelSpec(source=str(path.resolve()))
    if not _HF_ID.match(source) or source.count("/") > 1:
        raise ModelSourceError(
            f"model {source!r} is neither builtin:<preset>, an existing directory, nor an HF id like "
            "google/flan-t5-large"
        )
    return ModelSpec(source=source)
