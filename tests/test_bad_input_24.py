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
    "opt_import.json": json.dumps({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "__import__(os)"}}),
    "sched_bogus.json": json.dumps({"train_micro_batch_size_per_gpu": 2, "scheduler": {"type": "Bogus"}}),
    "lr_string.json": json.dumps(
        {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": "1000"}}}
    ),
    "warmup_huge.json": json.dumps(
        {"train_micro_batch_size_per_gpu": 2, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1e308}}}
    ),
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
    # -- §6: baseline checks: the optimizer and scheduler types DeepSpeed knows, numbers as numbers -------------------
    Cli(
        "i24-baseline-optimizer-type",
        ["search", "--budget", "1m", "--baseline", "{tmp}/opt_import.json"],
        r"optimizer\.type '__import__\(os\)' is not an optimizer DeepSpeed knows; give one of .*AdamW.*adamw",
    ),
    Cli(
        "i24-baseline-scheduler-type",
        ["search", "--budget", "1m", "--baseline", "{tmp}/sched_bogus.json"],
        r"scheduler\.type 'Bogus' is not a scheduler DeepSpeed knows; give one of .*WarmupLR",
    ),
    Cli(
        "i24-baseline-lr-string",
        ["search", "--budget", "1m", "--baseline", "{tmp}/lr_string.json"],
        r"optimizer\.params\.lr is the string '1000'; give it as a number",
    ),
    Cli(
        "i24-baseline-warmup-1e308",
        ["doctor", "--ds-config", "{tmp}/warmup_huge.json"],
        r"scheduler\.params\.warmup_num_steps: 1e\+308 is outside \[0, 1,000,000,000\] steps",
    ),
    Cli(
        "i24-model-default-typed",  # the default model typed out, against a study of another model
        ["search", "--budget", "1m", "--storage", "{db}", "--study", "flan", "--model", "builtin:tiny-t5"],
        r"study 'flan' was created with a different model .*google/flan-t5-small",
    ),
    Cli(
        "i24-headroom-default-typed",
        ["search", "--budget", "1m", "--storage", "{db}", "--study", "flan", "--headroom", "0.9"],
        r"study 'flan' was created with a different headroom \(0\.8\)",
    ),
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
    Api(
        "i24-api-optimizer-type",
        "POST",
        "/studies",
        r"baseline\.optimizer\.type '__import__\(os\)' is not an optimizer DeepSpeed knows",
        body={"name": "opt", "baseline": {"optimizer": {"type": "__import__(os)"}}},
        headers=AUTH,
    ),
    Api(
        "i24-api-lr-string",
        "POST",
        "/studies",
        r"baseline\.optimizer\.params\.lr: '1000' is outside \(0, 1\]",
        body={"name": "lr", "baseline": {"optimizer": {"type": "AdamW", "params": {"lr": "1000"}}}},
        headers=AUTH,
    ),
    Api(
        "i24-api-hf-lr-string",
        "POST",
        "/studies",
        r"training_args\.learning_rate: '1000' is outside \(0, 1\]",
        body={"name": "lr", "training_args": {"per_device_train_batch_size": 2, "learning_rate": "1000"}},
        headers=AUTH,
    ),
    Api(
        "i24-api-warmup-1e308",
        "POST",
        "/studies",
        r"baseline\.scheduler\.params\.warmup_num_steps: 1e\+308 is outside \[0, 1e\+09\]",
        body={"name": "w", "baseline": {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1e308}}}},
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
    populate_study(url, "rep", confirm=False)  # its pick never re-probed longer (§6)
    for name, text in FILES.items():
        (tmp / name).write_text(text)
    _newer_optuna(tmp / "newer-optuna.db")
    _refusing(tmp / "full.db")
    _other_model(url)
    return {"tmp": tmp, "db": db, "url": url}


def _other_model(url: str) -> None:
    """Study "flan": the definition `tuner search --model google/flan-t5-small --headroom 0.8` stores."""
    from tuner.session.options import CLI as CLI_FACE
    from tuner.session.options import SearchOptions, prepare_request
    from tuner.storage.store import Store

    request, _ = prepare_request(SearchOptions(budget="1m", study="flan", headroom=0.8), url, CLI_FACE)
    definition = {**request.definition(), "model": {"source": "google/flan-t5-small", "overrides": {}}}
    Store(url).create_study("flan", definition)


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


# -- §6: a pick never re-probed longer says so in every face ---------------------------------------------------------
def _run_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    monkeypatch.setattr(sys, "argv", ["tuner", *argv])
    monkeypatch.setenv("COLUMNS", "400")
    code: object = 0
    try:
        tuner_main()
    except SystemExit as exit_info:
        code = exit_info.code
    out = capsys.readouterr()
    assert code in (0, None), out.err
    return out.out, out.err


@pytest.mark.parametrize(
    "argv",
    [
        ["best", "--study", "{study}"],
        ["best", "--study", "{study}", "--format", "deepspeed", "-o", "{tmp}/ds.json"],
        ["export", "--study", "{study}", "--format", "hf"],
        ["export", "--study", "{study}", "--format", "accelerate", "-o", "{tmp}/acc.yaml"],
    ],
    ids=["best", "best-o", "export", "export-o"],
)
def test_unconfirmed_pick_says_so_in_the_cli(
    argv: list[str], world24: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The report study's pick ("rep") was never re-probed longer; the API tests' ("t5-demo") was."""
    from tests.helpers.sample_storage import populate

    tmp = world24["tmp"]
    url = f"sqlite:///{tmp}/confirmed.db"
    if not (tmp / "confirmed.db").exists():
        populate(url)
    for study, storage, caveat in (("rep", world24["url"], True), ("t5-demo", url, False)):
        args = [a.replace("{study}", study).replace("{tmp}", str(tmp)) for a in argv]
        out, err = _run_cli([*args, "--storage", storage], monkeypatch, capsys)
        said = [line for line in err.splitlines() if "not confirmed" in line]
        if caveat:
            assert len(said) == 1 and f"tuner search --study {study}" in said[0], err
        else:
            assert not said, err
        if ("-o" not in args and args[-1] in ("json", "hf")) or args == ["best", "--study", study]:
            json.loads(out)  # stdout stays the config alone
        assert "not confirmed" not in out


def test_unconfirmed_pick_says_so_in_changes_and_api(
    world24: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = _run_cli(["best", "--study", "rep", "--changes", "--storage", world24["url"]], monkeypatch, capsys)
    assert out.splitlines()[0].startswith("not confirmed: trial "), out
    client = TestClient(create_app(Settings(storage=world24["url"], api_token=TOKEN)))
    body = client.get("/best-config", params={"study": "rep"}).json()
    assert body["confirmed"] is False and body["caveat"].startswith("not confirmed: trial ")
    assert body["changes"]["lines"][0] == body["caveat"]
    raw = client.get("/best-config", params={"study": "rep", "format": "deepspeed", "raw": "true"})
    assert raw.headers["X-Tuner-Caveat"] == body["caveat"]
    assert "not confirmed" not in raw.text


# -- §6: read commands never write ------------------------------------------------------------------------------------
FOREIGN_READS = [
    ["studies"],
    ["trials", "--study", "x"],
    ["best", "--study", "x"],
    ["export", "--study", "x"],
    ["report", "--study", "x", "-o", "{tmp}/r.html"],
]


@pytest.mark.parametrize("argv", FOREIGN_READS, ids=lambda a: a[0])
def test_read_commands_leave_a_foreign_sqlite_file_as_it_was(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = tmp_path / "app.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.close()
    before = foreign.read_bytes()
    monkeypatch.chdir(tmp_path)
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    monkeypatch.setattr(sys, "argv", ["tuner", *args, "--storage", f"sqlite:///{foreign}"])
    with pytest.raises(SystemExit) as exit_info:
        tuner_main()
    line = _one_error_line(capsys.readouterr().err)
    assert exit_info.value.code == 2, line
    assert re.search(r"is not a tuner database \(no tuner_studies table; left as it was\)", line), line
    assert foreign.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no -wal, -shm or report file


def test_read_commands_create_no_missing_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["tuner", "studies", "--storage", f"sqlite:///{tmp_path}/typo.db"])
    with pytest.raises(SystemExit) as exit_info:
        tuner_main()
    line = _one_error_line(capsys.readouterr().err)
    assert exit_info.value.code == 2 and "the file does not exist" in line, line
    assert not list(tmp_path.iterdir())
