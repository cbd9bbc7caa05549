"""Reads docker-compose.yml the way `docker compose` does (YAML, merge keys, ${VAR} interpolation) and parses a
service's command with the real tuner CLI (typer's click), without running it. Used by tests/test_compose.py and the
e2e tests, which run those same commands as local processes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
DOCKERFILE = COMPOSE.parent / "Dockerfile"
_VAR = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\})")


class ComposeError(ValueError):
    pass


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's substitution: ${V}, ${V:-default}, ${V-default}, ${V:?error}, ${V?error}, and $$ for a literal $."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group("name"), m.group("op"), m.group("arg") or ""
        value = env.get(name)
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op in (":-", "-"):
            return arg if unset else str(value)
        if op in (":?", "?"):
            if unset:
                raise ComposeError(f"{name}: {arg}")
            return str(value)
        return "" if value is None else str(value)

    return _VAR.sub(sub, text)


def _walk(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_walk(n, env) for n in node]
    if isinstance(node, dict):
        return {k: _walk(v, env) for k, v in node.items()}
    return node


def load(env: dict[str, str] | None = None, path: Path = COMPOSE) -> dict[str, Any]:
    """The compose file with YAML anchors/merge keys resolved and variables interpolated from ``env``."""
    return _walk(yaml.safe_load(path.read_text()), env or {})


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command")
    if isinstance(cmd, str):
        raise ComposeError("use the exec (list) form for commands: no shell between compose and tuner")
    return [str(a) for a in cmd]


def parse_cli(argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Parses ``argv`` (starting with 'tuner') with the real CLI, as the entry point would, without invoking it.
    Returns (the command path, e.g. ['db', 'upgrade'], its parsed parameters); raises the CLI's usage error."""
    from tuner.cli.app import _register, app

    if not argv or argv[0] != "tuner":
        raise ComposeError(f"command {argv!r} does not start with the tuner entry point")
    _register()
    group = typer.main.get_command(app)
    ctx = group.make_context("tuner", list(argv[1:]))
    path: list[str] = []
    cmd, args = group, list(argv[1:])
    while hasattr(cmd, "resolve_command"):
        name, sub, args = cmd.resolve_command(ctx, args)
        path.append(name)
        ctx = sub.make_context(name, args, parent=ctx)
        cmd = sub
        args = list(getattr(ctx, "_protected_args", []) or []) + list(ctx.args)
    return path, dict(ctx.params)


def with_option(argv: list[str], option: str, value: str) -> list[str]:
    """``argv`` with ``option``'s value replaced (or the option appended): test-scale values for the same command."""
    out = list(argv)
    if option in out:
        out[out.index(option) + 1] = value
    else:
        out += [option, value]
    return out


def local_process(service: str, storage: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) to run ``service`` of the compose file as a local process: the compose command and
    environment after interpolation from ``env``, with TUNER_STORAGE pointed at ``storage`` (the test's database
    instead of the `postgres` container), the image's /cache replaced by this machine's cache, and `tuner` resolved
    to this environment's entry point (its bin/ first on PATH, as on the image)."""
    import os

    from tests.helpers.servers import TUNER_BIN, clean_env

    spec = load(env)["services"][service]
    service_env = {k: str(v) for k, v in (spec.get("environment") or {}).items()}
    service_env["TUNER_STORAGE"] = storage
    for key in ("TUNER_CACHE_DIR", "HF_HOME"):
        service_env.pop(key, None)
    if os.environ.get("TUNER_CACHE_DIR"):
        service_env["TUNER_CACHE_DIR"] = os.environ["TUNER_CACHE_DIR"]
    argv = command(spec)
    bindir = os.path.dirname(TUNER_BIN)
    path = bindir + os.pathsep + os.environ.get("PATH", "")
    return [TUNER_BIN, *argv[1:]], clean_env({**service_env, "COLUMNS": "200", "PATH": path})
