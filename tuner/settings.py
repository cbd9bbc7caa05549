"""Settings read from the environment — the one place that does so (pydantic-settings, prefix TUNER_).

A bad value (TUNER_PORT=abc, TUNER_PROBE_LAUNCHER=foo) is a SettingsError: one line naming the variable and what it
takes, which the CLI prints with exit code 2.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tuner.errors import ConfigError

DEFAULT_STORAGE = "sqlite:///tuner.db"
ENV_PREFIX = "TUNER_"
ProbeLauncher = Literal["auto", "forkserver", "spawn"]


SECRET = "***"
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key", re.IGNORECASE)
_USERINFO = re.compile(r"(://[^/?#@:]*):[^/?#@]*@")
_QUERY_SECRET = re.compile(r"([?&][^=&#]*(?:pass|pwd|secret|token|key)[^=&#]*=)[^&#]*", re.IGNORECASE)


def url_secrets(url: str) -> list[str]:
    """The secrets a storage URL holds: its password and the values of password-like query parameters."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        m = re.search(r"://[^/?#@:]*:([^/?#@]*)@", url)
        return [m.group(1)] if m and m.group(1) else []
    found = [str(parsed.password)] if parsed.password else []
    for key, value in parsed.query.items():
        if _SECRET_PARAM.search(key):
            found += [value] if isinstance(value, str) else list(value)
    return [s for s in found if s]


def redact_url(url: str) -> str:
    """``url`` fit to print: the password and password-like query parameters (password=, sslpassword= ...) as ***,
    also when the URL does not parse."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return redact(_USERINFO.sub(rf"\1:{SECRET}@", url), url)
    shown = parsed.render_as_string(hide_password=True)
    return _QUERY_SECRET.sub(rf"\1{SECRET}", shown)


def public_url(url: str) -> str:
    """What an unauthenticated caller may see of the storage URL ``url`` (`/health`, the API's 503 bodies): its scheme
    and database name, no user, host, port, path or query ("sqlite database tuner.db")."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return "storage (unparsable URL)"
    name = Path(parsed.database).name if parsed.get_backend_name() == "sqlite" and parsed.database else parsed.database
    return f"{parsed.drivername} database {name or '(none)'}"


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite storage URL, None for any other (or an unparsable one: the store says what is wrong)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    return Path(parsed.database).expanduser()


def storage_host(url: str) -> str | None:
    """The server host of the storage URL ``url`` (None: none, or an unparsable URL): what the API looks for in a
    driver's message before showing it (api.errors)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).host
    except ArgumentError:
        return None


def redact(text: str, url: str) -> str:
    """``text`` (an error message, say) with every secret of the storage URL ``url`` replaced by ***."""
    for secret in sorted(url_secrets(url), key=len, reverse=True):
        text = text.replace(secret, SECRET)
    return text


class SettingsError(ConfigError):
    """A TUNER_* variable (or an option standing in for it) holds a value tuner cannot use."""


def _environment_tag() -> str:
    """py311-<hash of the interpreter's prefix>: tells virtualenvs apart without importing torch. The prefix as the
    interpreter was reached, not resolved: torch writes that path into each op's build.ninja, so one venv reached
    through a symlink and directly would otherwise share a folder and rebuild each other's ops in turns."""
    digest = hashlib.sha1(os.path.abspath(sys.prefix).encode()).hexdigest()[:10]
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
    default_study: str | None = Field(
        None,
        max_length=128,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="the study GET /best-config serves without study= (unset: study= is required)",
    )
    allowed_hosts: str | None = Field(
        None,
        max_length=4096,
        description="comma-separated Host names `tuner serve` answers (a.example, *.example, 10.0.0.5, * for any); "
        "unset: the loopback names on a loopback bind, any Host elsewhere (DNS rebinding: see tuner/hosts.py)",
    )
    api_body_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="seconds a request body may take to arrive at `tuner serve` (408 after)"
    )
    cache_dir: Path = Field(default_factory=_cache_dir, description="DeepSpeed's compiled ops, kept across probes")
    # how single-host probe ranks start: "auto" (the preloaded fork server on hosts without a GPU, else a fresh
    # interpreter), "forkserver" or "spawn"
    probe_launcher: ProbeLauncher = "auto"
    # how a probe's engine pins host memory for CPU offload (trials.contract_pinned): "deepspeed" (as DeepSpeed does),
    # "register[:N]" (torch's pinned_use_cuda_host_register, N threads) or "exact" (in place, at the exact size); the
    # probe's setup only, never the user's export
    pinned_alloc: str = "deepspeed"
    # the user's consent to run code a model's or tokenizer's folder ships (its auto_map); `tuner --trust-remote-code`
    # sets it (trials.contract.TRUST_REMOTE_CODE_ENV) for the command and every process it starts
    trust_remote_code: bool = False
    # a search across nodes (issue 43): the address this node's peers reach it at (torchrun --local-addr, the
    # rendezvous endpoint when it leads; unset: the address this host reaches the storage from), and how long a worker
    # waits for every node (at the start, and for each node to join a probe and its rendezvous)
    node_address: str | None = Field(None, min_length=1, max_length=253)
    node_timeout_s: float = Field(120.0, gt=0, le=86400)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """The repr (and str) show the storage URL without its password; the token is a SecretStr (shown as ***)."""
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name == "storage" and isinstance(value, str) else value

    @field_validator("probe_launcher", mode="before")
    @classmethod
    def _launcher_case(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("pinned_alloc")
    @classmethod
    def _pinned_variant(cls, value: str) -> str:
        from trials.contract import parse_pinned_alloc

        kind, threads = parse_pinned_alloc(value)
        return kind if threads is None else f"{kind}:{threads}"

    @field_validator("allowed_hosts")
    @classmethod
    def _host_list(cls, value: str | None) -> str | None:
        if value is not None:
            from tuner.hosts import parse_allowed_hosts

            try:
                parse_allowed_hosts(value)
            except ConfigError as err:
                raise ValueError(str(err)) from None
        return value

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
    "api_body_timeout_s": "a number of seconds above 0, at most 3600",
    "storage": "a SQLAlchemy URL such as sqlite:///tuner.db",
    "default_study": "a study name (letters, digits, . _ -)",
    "allowed_hosts": "comma-separated host names or addresses (*.domain and * allowed)",
    "node_address": "the host name or IP address the other nodes reach this one at",
    "node_timeout_s": "a number of seconds above 0, at most 86400",
    "pinned_alloc": "one of deepspeed, register, register:N (N a power of two up to 128), exact",
}


def _one_line(err: ValidationError, overrides: dict[str, object]) -> str:
    problems = []
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        given = e.get("input")
        if field == "api_token":  # never echo a secret
            where = f"{ENV_PREFIX}API_TOKEN"
        elif field == "storage" and isinstance(given, str):
            where = f"{ENV_PREFIX}STORAGE={redact_url(given)!r}"
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


@dataclass(frozen=True)
class SlurmStep:
    """The Slurm job step this process runs in (``srun``'s variables), when it spans several nodes: a search across
    nodes takes its node count from it. Only a step's own variables count (SLURM_STEP_NUM_NODES ...): a batch script's
    first node (SLURM_NNODES of the whole allocation, no step) is not a node of a search."""

    nnodes: int
    tasks: int  # tasks of the step: one tuner worker per node (srun --ntasks-per-node 1)
    node_id: int
    nodelist: str  # Slurm's compressed list of the step's nodes (a[1-2],b3)
    gpus_on_node: int | None


def _slurm_int(env: dict[str, str] | os._Environ[str], name: str) -> int | None:
    value = env.get(name, "").strip().split("(")[0]  # SLURM_TASKS_PER_NODE-style "2(x3)" counts: the first
    return int(value) if value.isdigit() else None


def slurm_step(env: dict[str, str] | None = None) -> SlurmStep | None:
    """The Slurm step of ``env`` (default: this process's) across more than one node, or None."""
    source = os.environ if env is None else env
    nodes = _slurm_int(source, "SLURM_STEP_NUM_NODES")
    if nodes is None or nodes < 2:
        return None
    return SlurmStep(
        nnodes=nodes,
        tasks=_slurm_int(source, "SLURM_STEP_NUM_TASKS") or nodes,
        node_id=_slurm_int(source, "SLURM_NODEID") or 0,
        nodelist=source.get("SLURM_STEP_NODELIST", "") or source.get("SLURM_JOB_NODELIST", ""),
        gpus_on_node=_slurm_int(source, "SLURM_GPUS_ON_NODE"),
    )
