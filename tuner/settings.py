"""Settings read from the environment — the one place that does so (pydantic-settings, prefix TUNER_).

A bad value (TUNER_PORT=abc, TUNER_PROBE_LAUNCHER=foo) is a SettingsError: one line naming the variable and what it
takes, which the CLI prints with exit code 2.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tuner.errors import ConfigError

DEFAULT_STORAGE = "sqlite:///tuner.db"
ENV_PREFIX = "TUNER_"
ProbeLauncher = Literal["auto", "forkserver", "spawn"]


class SettingsError(ConfigError):
    """A TUNER_* variable (or an option standing in for it) holds a value tuner cannot use."""


def _environment_tag() -> str:
    """py311-<hash of the interpreter's prefix>: tells virtualenvs apart without importing torch."""
    digest = hashlib.sha1(os.path.realpath(sys.prefix).encode()).hexdigest()[:10]
    return f"py{sys.version_info.major}{sys.version_info.minor}-{digest}"


def _cache_dir() -> Path:
    """The default of TUNER_CACHE_DIR: $XDG_CACHE_HOME/tuner, else ~/.cache/tuner."""
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "tuner"


class Settings(BaseSettings):
    """Each field ``f`` comes from the keyword argument, else ``$TUNER_F`` (empty counts as unset), else its default."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, frozen=True, extra="forbid")

    storage: str = Field(DEFAULT_STORAGE, description="SQLAlchemy URL of Optuna's tables and ours")
    api_token: SecretStr | None = Field(None, description="bearer token for API writes (unset: writes refused)")
    host: str = Field("127.0.0.1", min_length=1, description="`tuner serve` bind address")
    port: int = Field(8000, ge=1, le=65535, description="`tuner serve` TCP port")
    cache_dir: Path = Field(default_factory=_cache_dir, description="DeepSpeed's compiled ops, kept across probes")
    # how single-host probe ranks start: "auto" (the preloaded fork server on hosts without a GPU, else a fresh
    # interpreter), "forkserver" or "spawn"
    probe_launcher: ProbeLauncher = "auto"

    @field_validator("probe_launcher", mode="before")
    @classmethod
    def _launcher_case(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("api_token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    @property
    def torch_extensions_dir(self) -> Path:
        """DeepSpeed's JIT-compiled ops (cpu_adam, shm comm) survive across probes and searches here.

        One folder per Python environment: torch's JIT writes the environment's include paths into build.ninja, so
        two virtualenvs sharing a folder would rebuild each other's ops on every switch, inside a probe's clock.
        """
        return self.cache_dir / "torch_extensions" / _environment_tag()


# What each field takes, in the words of the one-line error.
_TAKES = {
    "port": "an integer from 1 to 65535",
    "probe_launcher": "one of auto, forkserver, spawn",
    "host": "a host name or IP address",
    "cache_dir": "a directory path",
    "storage": "a SQLAlchemy URL such as sqlite:///tuner.db",
}


def _one_line(err: ValidationError, overrides: dict[str, object]) -> str:
    problems = []
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        given = e.get("input")
        if field == "api_token":  # never echo a secret
            where = f"{ENV_PREFIX}API_TOKEN"
        elif field in overrides:
            where = f"{field}={given!r}"
        elif field in Settings.model_fields:
            where = f"{ENV_PREFIX}{field.upper()}={given!r}"
        else:  # an unknown keyword: a caller's bug, still said in one line
            where = f"{field}"
        takes = _TAKES.get(field)
        fix = f"give {takes}" if takes else e["msg"].lower()
        unset = f", or unset it (default {_default(field)})" if field not in overrides and field in _TAKES else ""
        problems.append(f"{where} is not valid: {fix}{unset}")
    return "; ".join(problems)


def _default(field: str) -> str:
    info = Settings.model_fields[field]
    if info.default_factory is not None:
        return str(info.default_factory())  # type: ignore[call-arg]
    return str(info.default)


def load_settings(**overrides: object) -> Settings:
    """The settings, with each non-None keyword (a CLI option, say) taking the place of its variable."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**given)  # type: ignore[arg-type]
    except ValidationError as err:
        raise SettingsError(_one_line(err, given)) from None
