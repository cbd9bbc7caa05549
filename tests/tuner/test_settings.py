"""tuner.settings: the TUNER_* environment through pydantic-settings. Defaults, overrides, and every bad value as one
line naming the variable and what it takes: from load_settings, through the real `tuner` entry point (exit 2, no
traceback), and from the API's app factory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from api.app import create_app
from tests.helpers.servers import TUNER_BIN, clean_env, free_port
from tuner.errors import ConfigError, TunerError
from tuner.settings import DEFAULT_STORAGE, Settings, SettingsError, load_settings

VARS = ("STORAGE", "API_TOKEN", "HOST", "PORT", "CACHE_DIR", "PROBE_LAUNCHER")
BAD = [
    ("TUNER_PORT", "abc", "an integer from 1 to 65535"),
    ("TUNER_PORT", "70000", "an integer from 1 to 65535"),
    ("TUNER_PORT", "0", "an integer from 1 to 65535"),
    ("TUNER_PROBE_LAUNCHER", "foo", "one of auto, forkserver, spawn"),
]


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in VARS:
        monkeypatch.delenv(f"TUNER_{name}", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def test_defaults(tmp_path: Path) -> None:
    s = load_settings()
    assert (s.storage, s.api_token, s.host, s.port, s.probe_launcher) == (
        DEFAULT_STORAGE,
        None,
        "127.0.0.1",
        8000,
        "auto",
    )
    assert s.cache_dir == tmp_path / "xdg" / "tuner"
    assert s.torch_extensions_dir.parent == tmp_path / "xdg" / "tuner" / "torch_extensions"
    assert s.torch_extensions_dir.name.startswith("py3")


def test_values_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TUNER_STORAGE", "postgresql+psycopg://u@h/db")
    monkeypatch.setenv("TUNER_API_TOKEN", "s3cret")
    monkeypatch.setenv("TUNER_HOST", "0.0.0.0")
    monkeypatch.setenv("TUNER_PORT", "9001")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TUNER_PROBE_LAUNCHER", " Spawn ")
    monkeypatch.setenv("TUNER_TORCH_SPEC", "torch==2.5.1")  # other TUNER_* variables (scripts, tests) are not settings
    s = load_settings()
    assert (s.storage, s.host, s.port, s.probe_launcher) == ("postgresql+psycopg://u@h/db", "0.0.0.0", 9001, "spawn")
    assert s.api_token is not None and s.api_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(s) and "s3cret" not in str(s)
    assert s.torch_extensions_dir.parent == tmp_path / "cache" / "torch_extensions"


def test_empty_variables_count_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARS:
        monkeypatch.setenv(f"TUNER_{name}", "")
    s = load_settings()
    assert (s.storage, s.api_token, s.host, s.port, s.probe_launcher) == (
        DEFAULT_STORAGE,
        None,
        "127.0.0.1",
        8000,
        "auto",
    )


def test_overrides_win_and_none_means_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_STORAGE", "sqlite:///env.db")
    monkeypatch.setenv("TUNER_PORT", "abc")  # an option given in its place: the bad variable does not matter
    s = load_settings(storage="sqlite:///opt.db", port=8123, host=None)
    assert (s.storage, s.port, s.host) == ("sqlite:///opt.db", 8123, "127.0.0.1")
    assert load_settings(storage=None, port=8123).storage == "sqlite:///env.db"


def test_settings_built_directly_as_the_api_tests_do() -> None:
    s = Settings(storage="sqlite:///x.db", api_token="tok")
    assert s.api_token is not None and s.api_token.get_secret_value() == "tok"
    assert Settings(storage="sqlite:///x.db", api_token=None).api_token is None
    with pytest.raises(Exception, match="frozen"):
        s.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(("var", "value", "takes"), BAD, ids=[f"{v}={x}" for v, x, _ in BAD])
def test_a_bad_variable_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, takes: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    err = caught.value
    assert isinstance(err, ConfigError) and isinstance(err, TunerError) and err.exit_code == 2
    assert (
        str(err)
        == f"{var}={value!r} is not valid: give {takes}, or unset it (default {'8000' if 'PORT' in var else 'auto'})"
    )


def test_a_bad_override_names_the_option_not_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"^port=70000 is not valid: give an integer from 1 to 65535$"):
        load_settings(port=70000)


def test_two_bad_variables_are_still_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_PORT", "x")
    monkeypatch.setenv("TUNER_PROBE_LAUNCHER", "y\nz")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    text = str(caught.value)
    assert "\n" not in text and "TUNER_PORT='x'" in text and "TUNER_PROBE_LAUNCHER='y\\nz'" in text


def test_the_app_factory_raises_the_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_PORT", "abc")
    with pytest.raises(SettingsError, match=r"^TUNER_PORT='abc' is not valid"):
        create_app()
    monkeypatch.delenv("TUNER_PORT")
    assert create_app(Settings(storage="sqlite:///x.db")).title == "tuner"


def _tuner(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([TUNER_BIN, *args], capture_output=True, text=True, env=clean_env(env), timeout=120)


@pytest.mark.parametrize(("var", "value", "takes"), BAD[::3], ids=["port", "launcher"])
def test_the_cli_prints_one_line_and_exits_2(sqlite_url: str, var: str, value: str, takes: str) -> None:
    for args in (["db", "upgrade", "--storage", sqlite_url], ["studies", "--storage", sqlite_url], ["serve"]):
        out = _tuner(*args, env={var: value})
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.strip() == f"error: {var}={value!r} is not valid: give {takes}, or unset it " + (
            "(default 8000)" if "PORT" in var else "(default auto)"
        ), (args, out.stderr)
        assert "Traceback" not in out.stderr and out.stdout == ""


def test_serve_with_the_port_option_ignores_a_bad_port_variable(sqlite_url: str) -> None:
    # settings load (the --port option stands in for TUNER_PORT), then the public bind without a token is refused
    out = _tuner(
        "serve", "--storage", sqlite_url, "--port", str(free_port()), "--host", "0.0.0.0", env={"TUNER_PORT": "abc"}
    )
    assert out.returncode == 2 and "refusing to serve" in out.stderr and "TUNER_PORT" not in out.stderr, out.stderr


def test_a_venv_reached_through_a_symlink_has_its_own_op_cache(tmp_path, monkeypatch):
    """torch writes the interpreter's path into each op's build.ninja: the venv reached directly and through a link
    must not share an op folder (they rebuilt each other's ops in turns, 1.5-2.5 min a build)."""
    real = tmp_path / "venv"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    folders = set()
    for prefix in (real, tmp_path / "link", real):
        monkeypatch.setattr(sys, "prefix", str(prefix))
        folders.add(load_settings(cache_dir=str(tmp_path / "cache")).torch_extensions_dir)
    assert len(folders) == 2
