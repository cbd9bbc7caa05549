"""What a probe's ranks inherit: the environment (op caches, the venv's tools first on PATH, thread counts) and the
offline view of a hub model, resolved once per runner process."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from trials.contract import BUILTIN_PREFIX, PINNED_ALLOC_ENV, ModelSpec, pinned_alloc_text
from tuner.files import private_dir
from tuner.probing import gpus
from tuner.probing.arch_list import ARCH_ENV, needs_rewrite, parseable_arch_list
from tuner.settings import Settings, load_settings


def probe_env(
    world_size: int, base: dict[str, str] | None = None, *, settings: Settings | None = None
) -> dict[str, str]:
    """The environment every rank inherits: op caches, the venv's tools first on PATH, sane thread counts.

    ``settings``: where the op cache is (the probe runner passes its own); None reads them, for a one-off caller
    (``tuner prepare``, the preflight)."""
    env = without_secrets(dict(os.environ if base is None else base))
    settings = settings or load_settings()
    private_dir(settings.cache_dir)  # op builds run from here: no other user's files
    ext = settings.torch_extensions_dir
    ext.mkdir(parents=True, exist_ok=True)
    env["TORCH_EXTENSIONS_DIR"] = str(ext)
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // world_size))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env.setdefault("NCCL_DEBUG", "WARN")  # a rank's stderr tail then carries NCCL's reason for a failure or hang
    # how the engine's setup pins host memory (trials.pinned): the setting, with register's thread count decided here
    env[PINNED_ALLOC_ENV] = pinned_alloc_text(settings.pinned_alloc, os.cpu_count() or 1)
    _arch_list_deepspeed_parses(env)
    return env


def _arch_list_deepspeed_parses(env: dict[str, str]) -> None:
    """On a GPU host: a TORCH_CUDA_ARCH_LIST DeepSpeed's op builder parses, in the ranks' and builds' environment only
    (tuner.probing.arch_list): "9.0a" -> "9.0"; none set: the visible devices' capabilities."""
    user = env.get(ARCH_ENV)
    if (user and not needs_rewrite(user)) or not gpus.has_visible_gpus(env):
        return
    arch = parseable_arch_list(user, gpus.visible_capabilities(env))
    if arch is not None:
        env[ARCH_ENV] = arch


# what a rank must not read from /proc/<pid>/environ: tuner's API token and storage URL (it may carry a password), the
# database client's password variables, and anything named like a secret
SECRET_NAMES = frozenset({"TUNER_API_TOKEN", "TUNER_STORAGE", "PGPASSWORD", "PGPASSFILE", "MYSQL_PWD"})
SECRET_WORDS = ("PASSWORD", "PASSWD", "SECRET", "API_TOKEN", "API_KEY", "PRIVATE_KEY")


def without_secrets(env: dict[str, str]) -> dict[str, str]:
    """``env`` less tuner's own secrets and variables named like one (the ranks need none of them; HF_TOKEN stays:
    a gated hub model's files are fetched with it)."""
    return {k: v for k, v in env.items() if k not in SECRET_NAMES and not any(w in k.upper() for w in SECRET_WORDS)}


def hub_id(spec: ModelSpec) -> str | None:
    """The HF hub id a probe's ranks would look up on the network: None for a built-in preset or a local directory."""
    if spec.source.startswith(BUILTIN_PREFIX) or Path(spec.source).expanduser().is_dir():
        return None
    return spec.source


_RESOLVED: set[str] = set()


def resolve_hub_model(spec: ModelSpec) -> dict[str, str]:
    """Resolves a hub id once per runner process (its config into the HF cache); the environment that makes the ranks
    read it offline (HF_HUB_OFFLINE=1). Empty for built-in and local models. Raises OSError when it cannot resolve."""
    repo = hub_id(spec)
    if repo is None:
        return {}
    if repo not in _RESOLVED:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

        try:
            hf_hub_download(repo, "config.json")
        except (HfHubHTTPError, LocalEntryNotFoundError, ValueError) as exc:
            raise OSError(f"could not resolve model {repo!r} on the hub: {type(exc).__name__}: {exc}") from exc
        with contextlib.suppress(HfHubHTTPError, LocalEntryNotFoundError, ValueError):
            hf_hub_download(repo, "generation_config.json")  # optional
        _RESOLVED.add(repo)
    return {"HF_HUB_OFFLINE": "1"}


__all__ = ["hub_id", "probe_env", "resolve_hub_model"]
