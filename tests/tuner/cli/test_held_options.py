"""Issue 38 (nothing invented, nothing switched), through the commands a user types: with their files the global
batch is theirs (a different --global-batch is one line naming both, unless --change-global-batch), --model is
required, a --device-memory without a unit is refused, and a hub id that does not resolve is one line, exit 2, with
HF_HUB_OFFLINE set or not (no retries: the hub is an unreachable local port here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.errors import ConfigError

TUNER = str(Path(sys.executable).with_name("tuner"))
DS = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}}
NOT_THERE = "no-such-org/no-such-model"


def tuner(*args: str, **env: str | None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"}
    environ.update({k: v for k, v in env.items() if v is not None})
    for name in [k for k, v in env.items() if v is None]:
        environ.pop(name, None)
    return subprocess.run([TUNER, *args], capture_output=True, text=True, timeout=120, env=environ, check=False)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    """Their DeepSpeed JSON: micro 2 x accumulation 2 x world 2 = global batch 8."""
    (tmp_path / "ds.json").write_text(json.dumps(DS))
    return ["--baseline", str(tmp_path / "ds.json"), "--world-size", "2", "--storage", f"sqlite:///{tmp_path}/t.db"]


def test_a_different_global_batch_beside_their_files_is_refused_naming_both(files: list[str]) -> None:
    for command in (["search", "--dry-run", "--budget", "1m"], ["explain", "--device-memory", "1GiB"], ["estimate"]):
        line = one_line(tuner(*command, "--model", "builtin:tiny-t5", *files, "--global-batch", "16"))
        assert "--global-batch 16 differs from your files' global batch 8 (micro 2 x accumulation 2 x world 2)" in line
        assert "--change-global-batch" in line


def test_a_global_batch_asked_for_as_a_change_is_searched_and_said(files: list[str]) -> None:
    args = ["--model", "builtin:tiny-t5", *files, "--global-batch", "16", "--change-global-batch"]
    done = tuner("search", "--dry-run", "--budget", "1m", *args)
    assert done.returncode == 0, done.stderr
    assert "global batch 16" in done.stdout.splitlines()[0]
    assert "global batch (16: --change-global-batch, a change to your files' 8 (micro 2 x accumulation 2" in done.stdout
    same = tuner("search", "--dry-run", "--budget", "1m", "--model", "builtin:tiny-t5", *files, "--global-batch", "8")
    assert same.returncode == 0, same.stderr  # their own global batch, typed: nothing to refuse
    alone = one_line(tuner("search", "--dry-run", "--budget", "1m", "--change-global-batch"))
    assert "--change-global-batch goes with --global-batch N" in alone


def test_their_files_need_the_model_named(files: list[str], tmp_path: Path) -> None:
    for command in (["search", "--dry-run", "--budget", "1m"], ["explain", "--device-memory", "1GiB"]):
        line = one_line(tuner(*command, *files))
        assert "pass --model with your files" in line and "builtin:tiny-t5 is the default only without files" in line
    typed = tuner("search", "--dry-run", "--budget", "1m", "--model", "builtin:tiny-t5", *files)
    assert typed.returncode == 0, typed.stderr  # the preset typed out is a choice, not a default
    import tuner as api

    with pytest.raises(ConfigError, match=r"^pass model with your files"):
        api.tune(budget="1m", baseline=DS, world_size=2, storage=f"sqlite:///{tmp_path}/tune.db")


def test_a_device_memory_without_a_unit_is_refused_naming_the_forms(files: list[str]) -> None:
    line = one_line(tuner("explain", "--model", "builtin:tiny-t5", *files, "--device-memory", "160"))
    assert "--device-memory: memory size '160' has no unit; write it like 160MiB, 80GiB or 80GB" in line


@pytest.mark.parametrize("offline", ["1", None], ids=["HF_HUB_OFFLINE=1", "online"])
def test_a_model_id_that_does_not_resolve_is_one_line(offline: str | None) -> None:
    env = {"HF_HUB_OFFLINE": offline, "HF_ENDPOINT": "http://127.0.0.1:9"}  # online: a port that refuses at once
    commands = (
        ["search", "--dry-run", "--budget", "1m", "--max-length", "64", "--storage", "sqlite://"],
        ["estimate", "--micro-batch-size", "2", "--max-length", "64"],
        ["explain", "--max-length", "64", "--device-memory", "1GiB", "--storage", "sqlite://"],
    )
    for command in commands:
        line = one_line(tuner(*command, "--model", NOT_THERE, **env))
        assert f"model '{NOT_THERE}' is not in your Hugging Face cache" in line
        assert ("HF_HUB_OFFLINE is set" if offline else "the hub is unreachable") in line


def test_the_search_explain_suggests_names_the_model_and_the_change_asked_for() -> None:
    from tuner.cli.explain import _search_command

    given = {"model": "builtin:tiny-t5", "baseline": "ds.json", "global_batch": 16, "change_global_batch": True}
    command = _search_command(given)
    assert "--model builtin:tiny-t5" in command and "--global-batch 16 --change-global-batch" in command
    assert "--model" not in _search_command({"model": "builtin:tiny-t5"})  # the default, without files
