"""Bad input, issue 24 ("nothing lost, nothing let in, second round"): the cases of tests/test_bad_input.py's tables
that issue 24 adds, run by the same rules (one line, exit 2 or a 4xx, nothing stored, no traceback or 5xx). Each
failed on the code before its fix: a RecursionError or MemoryError traceback, a read of /dev/zero without end, a
500 on POST and on every later GET of a stored 900-deep definition."""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.helpers.report_study import populate_study
from tests.test_bad_input import AUTH, Api, Cli, _one_error_line, _snapshot
from tuner.cli import main as tuner_main
from tuner.settings import Settings

TOKEN = "bad-input-token"


def _deep(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


FILES: dict[str, str] = {
    "deep900.json": json.dumps({"learning_rate": 1e-4, "per_device_train_batch_size": 2, "extra": _deep(900)}),
    "deep100k.json": "[" * 100_000 + "]" * 100_000,
    "deep_optimizer.json": json.dumps(
        {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": _deep(900)}}
    ),
    "wide.json": json.dumps({"per_device_train_batch_size": 2, **{f"k{i}": i for i in range(20_000)}}),
    "deep.yaml": "micro_batch_size: " + "[" * 900 + "1" + "]" * 900 + "\n",
    "big.json": '{"per_device_train_batch_size": 2, "pad": "' + "x" * (5 * 1024 * 1024) + '"}',
}
CLI: list[Cli] = [
    Cli("i24-baseline-deep", ["search", "--budget", "1m", "--baseline", "{tmp}/deep900.json"], r"extra(\.a)+.*32"),
    Cli("i24-baseline-100k-deep", ["search", "--budget", "1m", "--baseline", "{tmp}/deep100k.json"], r"deeper than 32"),
    Cli(
        "i24-baseline-deep-optimizer",
        ["search", "--budget", "1m", "--baseline", "{tmp}/deep_optimizer.json"],
        r"optimizer\.params(\.a)+.*deeper than 32",
    ),
    Cli("i24-baseline-wide", ["search", "--budget", "1m", "--baseline", "{tmp}/wide.json"], r"more than 10000 keys"),
    Cli("i24-baseline-dev-zero", ["search", "--budget", "1m", "--baseline", "/dev/zero"], r"not a regular file"),
    Cli("i24-baseline-big", ["search", "--budget", "1m", "--baseline", "{tmp}/big.json"], r"over 4 MiB"),
    Cli("i24-baseline-dir", ["search", "--budget", "1m", "--baseline", "{tmp}"], r"not a regular file"),
    Cli("i24-doctor-deep", ["doctor", "--training-args", "{tmp}/deep900.json"], r"deeper than 32"),
    Cli("i24-doctor-dev-zero", ["doctor", "--ds-config", "/dev/zero"], r"not a regular file"),
    Cli("i24-space-deep", ["search", "--budget", "1m", "--space", "{tmp}/deep.yaml"], r"deeper than 32"),
    Cli("i24-space-dev-zero", ["search", "--budget", "1m", "--space", "/dev/zero"], r"not a regular file"),
    Cli("i24-lengths-dev-zero", ["search", "--budget", "1m", "--lengths", "/dev/zero"], r"not a regular file"),
    Cli("i24-lengths-deep", ["search", "--budget", "1m", "--lengths", "{tmp}/deep100k.json"], r"lengths file"),
]
LONG = "s" * 200
CLI += [
    # -- §4: tracebacks on user mistakes -----------------------------------------------------------------------------
    Cli("i24-storage-mysql", ["trials", "--storage", "mysql://u:pw@127.0.0.1/x"], r"SQLite or PostgreSQL, not 'mysql'"),
    Cli(
        "i24-storage-psycopg2",
        ["trials", "--storage", "postgresql+psycopg2://u@127.0.0.1:9/x"],
        r"driver of 'postgresql\+psycopg2' is not installed",
    ),
    Cli("i24-storage-memory", ["trials", "--storage", "sqlite://"], r"in-memory database"),
    Cli("i24-storage-memory-named", ["trials", "--storage", "sqlite:///:memory:"], r"in-memory database"),
    Cli("i24-storage-not-sqlite", ["trials", "--storage", "sqlite:///{tmp}/deep900.json"], r"not a SQLite database"),
    Cli(
        "i24-storage-newer-optuna",
        ["db", "upgrade", "--storage", "sqlite:///{tmp}/newer-optuna.db"],
        r"written by optuna 9\.0\.0, which this host's optuna .* cannot read",
    ),
    Cli(
        "i24-storage-refuses-study",
        ["search", "--budget", "1m", "--model", "builtin:tiny-t5", "--storage", "sqlite:///{tmp}/full.db"],
        r"storage refused the study .*disk is full \(injected\)",
    ),
    Cli(
        "i24-estimate-micro-batch-1e18",
        ["estimate", "--model", "builtin:tiny-t5", "--micro-batch-size", "1000000000000000000"],
        r"--micro-batch-size.*65536",
    ),
    Cli(
        "i24-estimate-world",
        ["estimate", "--model", "builtin:tiny-t5", "--micro-batch-size", "2", "--world-size", "500"],
        r"--world-size 500 is above 64",
    ),
    Cli("i24-study-long", ["search", "--budget", "1m", "--study", LONG], r"--study 's{60}\.\.\. \(200 characters\)'"),
    Cli("i24-study-dotdot", ["search", "--budget", "1m", "--study", ".."], r"--study '\.\.' is not a study name"),
    Cli("i24-study-dot", ["search", "--budget", "1m", "--study", "."], r"not a study name"),
    Cli(
        "i24-study-escape", ["search", "--budget", "1m", "--study", "a\x1b[31mred\nb"], r"--study 'a\[31mred b' is not"
    ),
]
CLI += [
    Cli(
        "i24-trials-status", ["trials", "--storage", "{db}", "--status", "bogus"], r"--status 'bogus'.*ok, oom, timeout"
    ),
]
API: list[Api] = [
    Api(
        "i24-api-training-args-deep",
        "POST",
        "/studies",
        r"body\.training_args\.extra(\.a)+.*deeper than 32",
        body={"name": "deep", "training_args": {"per_device_train_batch_size": 2, "extra": _deep(900)}},
        headers=AUTH,
    ),
    Api(
        "i24-api-optimizer-deep",
        "POST",
        "/studies",
        r"body\.baseline\.optimizer\.params(\.a)+.*deeper than 32",
        body={"name": "deep", "baseline": {"optimizer": {"type": "AdamW", "params": _deep(900)}}},
        headers=AUTH,
    ),
    Api(
        "i24-api-wide",
        "POST",
        "/studies",
        r"more than 10000 keys",
        body={"name": "wide", "training_args": {"per_device_train_batch_size": 2, "x": [0] * 11_000}},
        headers=AUTH,
    ),
    Api("i24-api-name-dotdot", "POST", "/studies", r"name", body={"name": ".."}, headers=AUTH),
    Api("i24-api-name-dot", "POST", "/studies", r"name", body={"name": "."}, headers=AUTH),
    Api("i24-api-get-dotdot", "GET", "/studies/%2e%2e", r"name|pattern"),
    Api("i24-api-raw-deep", "POST", "/studies", r"body|json|deep", (400, 422), raw="[" * 100_000, headers=AUTH),
]


@pytest.fixture(scope="module")
def world24(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("bad24")
    db = tmp / "tuner.db"
    url = f"sqlite:///{db}"
    populate_study(url, "rep")
    for name, text in FILES.items():
        (tmp / name).write_text(text)
    _newer_optuna(tmp / "newer-optuna.db")
    _refusing(tmp / "full.db")
    return {"tmp": tmp, "db": db, "url": url}


def _newer_optuna(path: Path) -> None:
    """A storage whose Optuna tables say a newer Optuna (9.0.0, an unknown schema revision) wrote them."""
    from tuner.storage import optuna_storage

    optuna_storage(f"sqlite:///{path}", heartbeat_interval=None, grace_period=None)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'v9.0.0.z'")
        conn.execute("UPDATE version_info SET library_version = '9.0.0'")


def _refusing(path: Path) -> None:
    """A tuner storage whose study INSERTs all fail as a full disk would (not a duplicate name)."""
    from tuner.storage.store import Store

    Store(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TRIGGER full BEFORE INSERT ON tuner_studies "
            "BEGIN SELECT RAISE(ABORT, 'database or disk is full (injected)'); END"
        )


@pytest.mark.parametrize("case", CLI, ids=lambda c: c.id)
def test_issue24_cli_bad_input(
    case: Cli,
    world24: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNER_STORAGE", world24["url"])
    monkeypatch.delenv("TUNER_API_TOKEN", raising=False)
    monkeypatch.setenv("COLUMNS", "400")
    before = _snapshot(world24["db"])
    monkeypatch.setattr(
        sys,
        "argv",
        ["tuner", *(a.replace("{tmp}", str(world24["tmp"])).replace("{db}", world24["url"]) for a in case.argv)],
    )
    with pytest.raises(SystemExit) as exit_info:
        tuner_main()
    out = capsys.readouterr()
    line = _one_error_line(out.err)
    assert exit_info.value.code == 2, (exit_info.value.code, line)
    assert re.search(case.expect, line, re.IGNORECASE), line
    assert len(line) < 600, line  # a path 900 levels deep is cut, not printed whole
    assert _snapshot(world24["db"]) == before, "stored data changed"
    assert not list(tmp_path.iterdir()), "a bad command left files behind"


@pytest.mark.parametrize("case", API, ids=lambda c: c.id)
def test_issue24_api_bad_input(case: Api, world24: dict[str, Any]) -> None:
    before = _snapshot(world24["db"])
    client = TestClient(create_app(Settings(storage=world24["url"], api_token=TOKEN)), raise_server_exceptions=False)
    kwargs: dict[str, Any] = {"params": case.params, "headers": dict(case.headers)}
    if case.raw is not None:
        kwargs["content"] = case.raw
        kwargs["headers"]["Content-Type"] = "application/json"
    elif case.body is not None:
        kwargs["json"] = case.body
    resp = client.request(case.method, case.path, **kwargs)
    assert resp.status_code in case.status, (resp.status_code, resp.text[:2000])
    detail = resp.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and "Traceback" not in detail
    assert re.search(case.expect, detail, re.IGNORECASE), detail[:2000]
    assert len(detail) < 1000, detail[:2000]
    assert _snapshot(world24["db"]) == before, "stored data changed"
    assert client.get("/studies/rep").status_code == 200
