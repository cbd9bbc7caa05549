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


def resolve_local_model(source: str) -> ModelSpec:
    """``resolve_model`` for the faces that run on the user's host (`tuner search`, `estimate`, `explain`,
    ``tuner.tune``): a hub id must also resolve, checked before anything runs (``check_hub_model``)."""
    spec = resolve_model(source)
    if not spec.source.startswith(BUILTIN_PREFIX) and not Path(spec.source).is_absolute():
        check_hub_model(spec.source)
    return spec


def check_hub_model(repo_id: str) -> None:
    """A hub id resolves: its config.json in the local Hugging Face cache (no request), else, unless HF_HUB_OFFLINE is
    set, one request to the hub (no retries). A ModelSourceError in one line when it does not, within seconds."""
    import huggingface_hub
    from huggingface_hub import constants, errors

    if isinstance(huggingface_hub.try_to_load_from_cache(repo_id, "config.json"), str):
        return
    if constants.HF_HUB_OFFLINE:
        raise ModelSourceError(
            f"model {repo_id!r} is not in your Hugging Face cache and HF_HUB_OFFLINE is set: check the id, download "
            f"it first (hf download {repo_id}), or give a local model directory"
        )
    try:
        huggingface_hub.HfApi().model_info(repo_id, timeout=10)
    except errors.GatedRepoError:
        raise ModelSourceError(
            f"model {repo_id!r} is gated on the Hugging Face Hub: accept its terms and log in (hf auth login), or give "
            "a local model directory"
        ) from None
    except errors.RepositoryNotFoundError:
        raise ModelSourceError(
            f"model {repo_id!r} is not on the Hugging Face Hub (or is private): check the id, e.g. "
            "google/flan-t5-large, or give a local model directory"
        ) from None
    except Exception as err:  # the hub unreachable (no network, a proxy, a timeout): one line, not the retries
        raise ModelSourceError(
            f"model {repo_id!r} is not in your Hugging Face cache and the hub is unreachable "
            f"({type(err).__name__}): download it where the hub is reachable, or give a local model directory"
        ) from None
