"""Settings read from the environment — the one place that does so."""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_STORAGE = "sqlite:///tuner.db"


def _environment_tag() -> str:
    """py311-<hash of the interpreter's prefix>: tells virtualenvs apart without importing torch."""
    digest = hashlib.sha1(os.path.realpath(sys.prefix).encode()).hexdigest()[:10]
    return f"py{sys.version_info.major}{sys.version_info.minor}-{digest}"


def _cache_dir() -> Path:
    base = os.environ.get("TUNER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tuner"
    )
    return Path(base)


@dataclass(frozen=True)
class Settings:
    storage: str = DEFAULT_STORAGE
    api_token: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    cache_dir: Path = field(default_factory=_cache_dir)
    # how single-host probe ranks start: "auto" (the preloaded fork server on hosts without a GPU, else a fresh
    # interpreter), "forkserver" or "spawn"
    probe_launcher: str = "auto"

    @property
    def torch_extensions_dir(self) -> Path:
        """DeepSpeed's JIT-compiled ops (cpu_adam, shm comm) survive across probes and searches here.

        One folder per Python environment: torch's JIT writes the environment's include paths into build.ninja, so
        two virtualenvs sharing a folder would rebuild each other's ops on every switch, inside a probe's clock.
        """
        return self.cache_dir / "torch_extensions" / _environment_tag()


def load_settings(**overrides: object) -> Settings:
    env = os.environ
    values: dict[str, object] = {
        "storage": env.get("TUNER_STORAGE") or DEFAULT_STORAGE,
        "api_token": env.get("TUNER_API_TOKEN") or None,
        "host": env.get("TUNER_HOST") or "127.0.0.1",
        "port": int(env.get("TUNER_PORT") or 8000),
        "cache_dir": _cache_dir(),
        "probe_launcher": (env.get("TUNER_PROBE_LAUNCHER") or "auto").strip().lower(),
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Settings(**values)  # type: ignore[arg-type]
