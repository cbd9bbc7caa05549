"""Bad input, table-driven: budgets, space files, model sources, baseline JSONs, storage URLs, CLI option combinations,
API parameters and bodies. Each gets one clear line (CLI: `error: ...` on stderr, exit 2) or a 4xx JSON error with a
one-line `detail`; zero tracebacks, zero 5xx, and the stored data is byte-for-byte the same afterwards.

CLI cases run the console-script entry point `tuner.cli.main` in-process (one import for ~50 cases; a few run the real
`tuner` executable too, to show it is the same); API cases go through the ASGI app with a real SQLite storage."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.helpers.report_study import populate_study
from tuner.cli import main as tuner_main
from tuner.settings import Settings

TOKEN = "bad-input-token"
UNREACHABLE_PG = "postgresql+psycopg://nobody:hunter2@127.0.0.1:9/nodb?connect_timeout=2"


@dataclass(frozen=True)
class Cli:
    id: str
    argv: list[str]
    expect: str  # regex the one error line must match (case-insensitive)


@dataclass(frozen=True)
class Api:
    id: str
    method: str
    path: str
    expect: str  # regex the `detail` must match (case-insensitive)
    status: tuple[int, ...] = (422,)
    params: dict[str, Any] | None = None
    body: Any = None
    raw: str | None = None  # a raw request body (not JSON-encoded)
    headers: dict[str, str] = field(default_factory=dict)


AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOOD_BODY = {"name": "new-study", "world_size": 1}

# {tmp} is the test's folder with the files made by `bad_files`; {db} is the populated storage.
CLI_CASES: list[Cli] = [
    # -- budget strings ---------------------------------------------------------------------------------------------
    Cli("budget-word", ["search", "--budget", "soon"], r"budget 'soon' is not a duration"),
    Cli("budget-empty", ["search", "--budget", ""], r"budget '' is not a duration"),
    Cli("budget-negative", ["search", "--budget", "-5m"], r"budget '-5m' is not a duration"),
    Cli("budget-zero", ["search", "--budget", "0s"], r"budget '0s' is zero"),
    Cli("budget-unit", ["search", "--budget", "2x"], r"budget '2x' is not a duration"),
    Cli("budget-minus", ["search", "--budget", "1h-30m"], r"not a duration"),
    Cli("budget-missing", ["search"], r"missing option '--budget'"),
    # -- space files ------------------------------------------------------------------------------------------------
    Cli("space-missing", ["search", "--budget", "1m", "--space", "{tmp}/nope.yaml"], r"space file .* does not exist"),
    Cli(
        "space-unknown-key",
        ["search", "--budget", "1m", "--space", "{tmp}/unknown.yaml"],
        r"unknown knob 'learning_rat'",
    ),
    Cli("space-wrong-type", ["search", "--budget", "1m", "--space", "{tmp}/wrongtype.yaml"], r"micro_batch_size"),
    Cli(
        "space-empty-range", ["search", "--budget", "1m", "--space", "{tmp}/emptyrange.yaml"], r"low 64 is above high 2"
    ),
    Cli("space-empty-list", ["search", "--budget", "1m", "--space", "{tmp}/emptylist.yaml"], r"zero_stage"),
    Cli("space-absurd-zero", ["search", "--budget", "1m", "--space", "{tmp}/absurd.yaml"], r"zero_stage.*outside"),
    Cli("space-absurd-batch", ["search", "--budget", "1m", "--space", "{tmp}/hugebatch.yaml"], r"micro_batch_size"),
    Cli("space-bad-yaml", ["search", "--budget", "1m", "--space", "{tmp}/broken.yaml"], r"is not valid yaml"),
    Cli("space-bad-toml", ["search", "--budget", "1m", "--space", "{tmp}/broken.toml"], r"is not valid toml"),
    Cli("space-not-mapping", ["search", "--budget", "1m", "--space", "{tmp}/list.yaml"], r"must be a mapping"),
    Cli("space-is-dir", ["search", "--budget", "1m", "--space", "{tmp}"], r"space"),
    Cli("space-binary", ["search", "--budget", "1m", "--space", "{tmp}/binary.yaml"], r"space"),
    Cli(
        "space-torch-zero",
        ["search", "--budget", "1m", "--space", "{tmp}/torchzero.yaml"],
        r"engine 'torch' has no ZeRO",
    ),
    Cli("space-repeats", ["search", "--budget", "1m", "--space", "{tmp}/repeats.yaml"], r"repeats a value"),
    # -- model sources ----------------------------------------------------------------------------------------------
    Cli("model-missing-path", ["search", "--budget", "1m", "--model", "{tmp}/no-such-model"], r"does not exist"),
    Cli("model-not-model-dir", ["search", "--budget", "1m", "--model", "{tmp}/not-a-model"], r"no config\.json"),
    Cli("model-file", ["search", "--budget", "1m", "--model", "{tmp}/unknown.yaml"], r"not a directory"),
    Cli("model-unknown-builtin", ["search", "--budget", "1m", "--model", "builtin:gpt-17"], r"unknown built-in model"),
    Cli("model-empty", ["search", "--budget", "1m", "--model", " "], r"--model is empty"),
    Cli("model-garbage-id", ["search", "--budget", "1m", "--model", "a/b/c/d"], r"neither builtin"),
    Cli("model-shell", ["search", "--budget", "1m", "--model", "x; touch {tmp}/pwned"], r"model"),
    # -- the job: a real model has no default length; job flags are checked --------------------------------------
    Cli("job-no-length", ["search", "--budget", "1m", "--model", "{tmp}/a-model"], r"no sequence length.*--max-length"),
    Cli("job-bad-precision", ["search", "--budget", "1m", "--precision", "fp8"], r"--precision 'fp8'"),
    Cli("job-zero-length", ["search", "--budget", "1m", "--max-length", "0"], r"max-length"),
    Cli(
        "job-training-args-alone",
        ["search", "--budget", "1m", "--training-args", "{tmp}/unknown.yaml"],
        r"--training-args goes with --baseline",
    ),
    # -- baseline JSON ----------------------------------------------------------------------------------------------
    Cli("baseline-missing", ["search", "--budget", "1m", "--baseline", "{tmp}/nope.json"], r"baseline|nope\.json"),
    Cli("baseline-malformed", ["search", "--budget", "1m", "--baseline", "{tmp}/malformed.json"], r"json"),
    Cli(
        "baseline-not-object",
        ["search", "--budget", "1m", "--baseline", "{tmp}/array.json"],
        r"baseline|object|mapping",
    ),
    Cli("baseline-contradictory-batch", ["search", "--budget", "1m", "--baseline", "{tmp}/contradict.json"], r"batch"),
    Cli(
        "baseline-unknown-zero-key",
        ["search", "--budget", "1m", "--baseline", "{tmp}/unknownzero.json"],
        r"stagee|unknown",
    ),
    Cli("baseline-all-auto", ["search", "--budget", "1m", "--baseline", "{tmp}/allauto.json"], r"auto"),
    Cli("baseline-bad-stage", ["search", "--budget", "1m", "--baseline", "{tmp}/stage7.json"], r"stage"),
    # -- storage URLs -----------------------------------------------------------------------------------------------
    Cli("storage-not-url", ["report", "--study", "rep", "--storage", "not a url"], r"is not a SQLAlchemy URL"),
    Cli(
        "storage-unknown-dialect", ["report", "--study", "rep", "--storage", "nosuchdb://x/y"], r"unknown database kind"
    ),
    Cli("storage-unreachable-pg", ["report", "--study", "rep", "--storage", UNREACHABLE_PG], r"cannot reach storage"),
    Cli(
        "storage-sqlite-no-dir",
        ["report", "--study", "rep", "--storage", "sqlite:///{tmp}/no/such/dir/t.db"],
        r"cannot reach storage",
    ),
    Cli(
        "storage-db-upgrade-bad", ["db", "upgrade", "--storage", "mysql+nodriver://x"], r"storage URL|unknown database"
    ),
    Cli("storage-search-bad", ["search", "--budget", "1m", "--storage", "::::"], r"is not a SQLAlchemy URL"),
    # -- CLI option combinations ------------------------------------------------------------------------------------
    Cli("opt-unknown", ["search", "--budget", "1m", "--frobnicate"], r"no such option"),
    Cli("opt-unknown-command", ["frobnicate"], r"no such command"),
    Cli("opt-headroom-zero", ["search", "--budget", "1m", "--headroom", "0"], r"--headroom 0"),
    Cli("opt-headroom-big", ["search", "--budget", "1m", "--headroom", "1.5"], r"--headroom 1\.5"),
    Cli("opt-headroom-text", ["search", "--budget", "1m", "--headroom", "lots"], r"headroom"),
    Cli("opt-world-zero", ["search", "--budget", "1m", "--world-size", "0"], r"--world-size 0"),
    Cli("opt-global-zero", ["search", "--budget", "1m", "--global-batch", "0"], r"--global-batch 0"),
    Cli("opt-trials-zero", ["search", "--budget", "1m", "--n-trials", "0"], r"--n-trials 0"),
    Cli(
        "opt-batch-unreachable",
        ["search", "--budget", "1m", "--world-size", "2", "--global-batch", "3"],
        r"global batch|micro batch",
    ),
    Cli("opt-device-memory-word", ["search", "--budget", "1m", "--device-memory", "lots"], r"memory size 'lots'"),
    Cli("opt-device-memory-zero", ["search", "--budget", "1m", "--device-memory", "0MiB"], r"must be positive"),
    Cli(
        "opt-device-memory-no-unit",
        ["search", "--budget", "1m", "--device-memory", "160"],
        r"--device-memory: memory size '160' has no unit; write it like 160MiB, 80GiB or 80GB",
    ),
    Cli(
        "opt-device-memory-no-unit-estimate",
        ["estimate", "--model", "builtin:tiny-t5", "--micro-batch-size", "2", "--device-memory", "80"],
        r"--device-memory: memory size '80' has no unit; write it like 160MiB, 80GiB or 80GB",
    ),
    Cli("opt-lengths-missing", ["search", "--budget", "1m", "--lengths", "{tmp}/nope.txt"], r"nope\.txt|lengths"),
    Cli("report-no-study", ["report", "-o", "{tmp}/r.html"], r"missing option '--study'"),
    Cli("report-unknown-study", ["report", "--study", "nope", "-o", "{tmp}/r.html"], r"no study named 'nope'"),
    Cli("report-sqli-study", ["report", "--study", "x' OR '1'='1", "-o", "{tmp}/r.html"], r"no study named"),
    Cli("report-out-dir", ["report", "--study", "rep", "-o", "{tmp}"], r"is a directory"),
    Cli("report-out-missing-dir", ["report", "--study", "rep", "-o", "{tmp}/a/b/r.html"], r"does not exist"),
    Cli("serve-public-no-token", ["serve", "--host", "0.0.0.0"], r"refusing to serve on 0\.0\.0\.0"),
    Cli("serve-port-zero", ["serve", "--port", "0"], r"port"),
    Cli("serve-port-text", ["serve", "--port", "http"], r"port"),
    Cli(
        "estimate-zero-stage",
        ["estimate", "--model", "builtin:tiny-t5", "--micro-batch-size", "1", "--zero-stage", "5"],
        r"zero-stage",
    ),
    Cli(
        "estimate-micro-zero",
        ["estimate", "--model", "builtin:tiny-t5", "--micro-batch-size", "0"],
        r"micro-batch-size",
    ),
    Cli(
        "estimate-engine",
        ["estimate", "--model", "builtin:tiny-t5", "--micro-batch-size", "1", "--engine", "tpu"],
        r"engine",
    ),
    Cli(
        "estimate-precision",
        ["estimate", "--model", "builtin:tiny-t5", "--micro-batch-size", "1", "--precision", "fp8"],
        r"precision|fp8",
    ),
    Cli(
        "estimate-model-missing",
        ["estimate", "--model", "{tmp}/no-such-model", "--micro-batch-size", "1"],
        r"does not exist",
    ),
    Cli(
        "estimate-device-memory",
        ["estimate", "--model", "builtin:tiny-t5", "--micro-batch-size", "1", "--device-memory", "-3GiB"],
        r"memory size",
    ),
    Cli(
        "estimate-global-batch",
        [
            "estimate",
            "--model",
            "builtin:tiny-t5",
            "--micro-batch-size",
            "4",
            "--world-size",
            "2",
            "--global-batch",
            "12",
        ],
        r"multiple of .* = 8",
    ),
]

API_CASES: list[Api] = [
    Api("api-study-bad-chars", "GET", "/studies/a b;rm -rf", r"name"),
    Api("api-study-too-long", "GET", "/studies/" + "x" * 200, r"name"),
    Api("api-study-sqli", "GET", "/studies/x' OR 1=1--", r"name"),
    Api("api-study-unknown", "GET", "/studies/nope", r"no study named 'nope'", (404,)),
    Api("api-study-traversal", "GET", "/studies/..%2F..%2Fetc%2Fpasswd", r"name|not found", (404, 422)),
    Api("api-trials-unknown", "GET", "/studies/nope/trials", r"no study named", (404,)),
    Api("api-trials-limit-zero", "GET", "/studies/rep/trials", r"limit", params={"limit": 0}),
    Api("api-trials-limit-huge", "GET", "/studies/rep/trials", r"limit", params={"limit": 100000}),
    Api("api-trials-offset-neg", "GET", "/studies/rep/trials", r"offset", params={"offset": -1}),
    Api("api-trials-offset-text", "GET", "/studies/rep/trials", r"offset", params={"offset": "ten"}),
    Api("api-best-format", "GET", "/best-config", r"format", params={"study": "rep", "format": "xml"}),
    Api("api-best-study-chars", "GET", "/best-config", r"study", params={"study": "../../etc/passwd"}),
    Api("api-best-study-sqli", "GET", "/best-config", r"study", params={"study": "rep'; DROP TABLE tuner_probes;--"}),
    Api("api-best-unknown", "GET", "/best-config", r"no study named", (404,), params={"study": "nope"}),
    Api("api-best-no-stable", "GET", "/best-config", r"stable", (404,), params={"study": "empty"}),
    Api("api-best-raw-text", "GET", "/best-config", r"raw", params={"study": "rep", "raw": "maybe"}),
    Api("api-post-no-token", "POST", "/studies", r"missing bearer token", (401,), body=GOOD_BODY),
    Api(
        "api-post-wrong-token",
        "POST",
        "/studies",
        r"invalid bearer token",
        (401,),
        body=GOOD_BODY,
        headers={"Authorization": "Bearer guess"},
    ),
    Api(
        "api-post-basic-auth",
        "POST",
        "/studies",
        r"bearer",
        (401, 403),
        body=GOOD_BODY,
        headers={"Authorization": "Basic YWRtaW46YWRtaW4="},
    ),
    Api("api-post-bad-json", "POST", "/studies", r"json|body", raw="{not json", headers=AUTH),
    Api("api-post-not-object", "POST", "/studies", r"body|object|dict", body=[1, 2, 3], headers=AUTH),
    Api("api-post-extra-key", "POST", "/studies", r"cmd|extra", body={**GOOD_BODY, "cmd": "rm -rf /"}, headers=AUTH),
    Api("api-post-name-chars", "POST", "/studies", r"name", body={"name": "a;b$(x)"}, headers=AUTH),
    Api("api-post-name-long", "POST", "/studies", r"name", body={"name": "n" * 129}, headers=AUTH),
    Api("api-post-name-empty", "POST", "/studies", r"name", body={"name": ""}, headers=AUTH),
    Api("api-post-world-zero", "POST", "/studies", r"world_size", body={**GOOD_BODY, "world_size": 0}, headers=AUTH),
    Api("api-post-headroom", "POST", "/studies", r"headroom", body={**GOOD_BODY, "headroom": 2}, headers=AUTH),
    Api("api-post-budget-neg", "POST", "/studies", r"budget_s", body={**GOOD_BODY, "budget_s": -1}, headers=AUTH),
    Api("api-post-model-long", "POST", "/studies", r"model", body={**GOOD_BODY, "model": "m" * 600}, headers=AUTH),
    Api("api-post-duplicate", "POST", "/studies", r"already exists", (409,), body={"name": "rep"}, headers=AUTH),
    Api("api-post-types", "POST", "/studies", r"world_size", body={**GOOD_BODY, "world_size": "many"}, headers=AUTH),
    Api("api-method", "DELETE", "/studies/rep", r"method not allowed", (405,)),
    Api("api-unknown-path", "GET", "/admin", r"not found", (404,)),
]


def _snapshot(db: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return {t: sorted(map(repr, conn.execute(f'SELECT * FROM "{t}"'))) for t in tables}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("bad")
    db = tmp / "tuner.db"
    url = f"sqlite:///{db}"
    populate_study(url, "rep")
    from tuner.storage.store import Store

    Store(url).ensure_study("empty", {"device_memory": 1 << 29})
    files = {
        "unknown.yaml": "micro_batch_size: [1, 2]\nlearning_rat: [0.1]\n",
        "wrongtype.yaml": "micro_batch_size: [one, two]\n",
        "emptyrange.yaml": "micro_batch_size: {low: 64, high: 2}\n",
        "emptylist.yaml": "zero_stage: []\n",
        "absurd.yaml": "zero_stage: [0, 9]\n",
        "hugebatch.yaml": "micro_batch_size: [1, 100000000]\n",
        "broken.yaml": "micro_batch_size: [1, 2\n  zero_stage: {\n",
        "broken.toml": "micro_batch_size = [1, 2\n",
        "list.yaml": "- 1\n- 2\n",
        "torchzero.yaml": "engine: [torch]\nzero_stage: [1, 2]\n",
        "repeats.yaml": "micro_batch_size: [2, 2]\n",
        "malformed.json": '{"train_micro_batch_size_per_gpu": 4, ',
        "array.json": "[1, 2, 3]",
        "contradict.json": json.dumps(
            {
                "train_batch_size": 10,
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 2,
                "zero_optimization": {"stage": 2},
            }
        ),
        "unknownzero.json": json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stagee": 2}}),
        "allauto.json": json.dumps(
            {
                "train_batch_size": "auto",
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "zero_optimization": {"stage": "auto"},
            }
        ),
        "stage7.json": json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 7}}),
    }
    for name, text in files.items():
        (tmp / name).write_text(text)
    (tmp / "binary.yaml").write_bytes(b"\xff\xfe\x00\x81garbage\x00")
    (tmp / "a-model").mkdir()
    (tmp / "a-model" / "config.json").write_text('{"model_type": "t5"}')
    (tmp / "not-a-model").mkdir()
    (tmp / "not-a-model" / "weights.bin").write_bytes(b"\0" * 16)
    return {"tmp": tmp, "db": db, "url": url}


def _fill(arg: str, world: dict[str, Any]) -> str:
    return arg.replace("{tmp}", str(world["tmp"])).replace("{db}", str(world["db"]))


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, f"expected one line, got:\n{stderr}"
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def test_the_table_is_large_enough() -> None:
    ids = [c.id for c in CLI_CASES + ISSUE13_CLI] + [c.id for c in API_CASES + ISSUE13_API]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 60, len(ids)


@pytest.mark.parametrize("case", CLI_CASES, ids=lambda c: c.id)
def test_cli_bad_input(
    case: Cli,
    world: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)  # a default sqlite:///tuner.db would land here, never in the repo
    monkeypatch.setenv("TUNER_STORAGE", world["url"])
    monkeypatch.delenv("TUNER_API_TOKEN", raising=False)
    monkeypatch.setenv("COLUMNS", "400")  # one error line, not wrapped by the terminal width
    before = _snapshot(world["db"])
    monkeypatch.setattr(sys, "argv", ["tuner", *(_fill(a, world) for a in case.argv)])
    with pytest.raises(SystemExit) as exit_info:
        tuner_main()
    out = capsys.readouterr()
    line = _one_error_line(out.err)
    assert exit_info.value.code == 2, (exit_info.value.code, line)
    assert re.search(case.expect, line, re.IGNORECASE), line
    assert "Traceback" not in out.out
    assert _snapshot(world["db"]) == before, "stored data changed"
    assert not (world["tmp"] / "pwned").exists()
    assert not list(tmp_path.iterdir()), "a bad command left files behind"


@pytest.mark.parametrize("case", API_CASES, ids=lambda c: c.id)
def test_api_bad_input(case: Api, world: dict[str, Any]) -> None:
    before = _snapshot(world["db"])
    client = TestClient(create_app(Settings(storage=world["url"], api_token=TOKEN)), raise_server_exceptions=False)
    kwargs: dict[str, Any] = {"params": case.params, "headers": dict(case.headers)}
    if case.raw is not None:
        kwargs["content"] = case.raw
        kwargs["headers"]["Content-Type"] = "application/json"
    elif case.body is not None:
        kwargs["json"] = case.body
    resp = client.request(case.method, case.path, **kwargs)
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
    assert resp.status_code in case.status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    detail = resp.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and "Traceback" not in detail
    assert re.search(case.expect, detail, re.IGNORECASE), detail
    assert TOKEN not in resp.text
    assert _snapshot(world["db"]) == before, "stored data changed"


@pytest.mark.parametrize(
    "argv",
    [["search", "--budget", "soon"], ["report", "--study", "nope", "-o", "x.html"], ["serve", "--host", "0.0.0.0"]],
    ids=["budget", "report", "serve"],
)
def test_the_real_executable_agrees(argv: list[str], world: dict[str, Any], tmp_path: Path) -> None:
    env = {
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "TUNER_STORAGE": world["url"],
        "HOME": str(tmp_path),
        "COLUMNS": "400",
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("tuner")), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 2
    _one_error_line(done.stderr)


# -- resuming a study with options that contradict it (issue 13, point 11) -------------------------------------------
RESUME_CASES = [
    ("headroom", ["--headroom", "0.5"], r"different headroom \(0\.9\).*--study"),
    (
        "baseline",
        ["--model", "builtin:tiny-t5", "--baseline", "{tmp}/resume-baseline.json"],
        r"different baseline \(None\).*--study",
    ),
    ("world-size", ["--world-size", "2"], r"different world_size \(1\).*--study"),
]


@pytest.mark.parametrize("option,argv,expect", RESUME_CASES, ids=[c[0] for c in RESUME_CASES])
def test_resume_with_a_contradicting_option_names_the_field(
    option: str,
    argv: list[str],
    expect: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tuner.session.options import CLI, SearchOptions, prepare_request
    from tuner.session.session import resolve
    from tuner.storage.store import Store

    db = tmp_path / "resume.db"
    url = f"sqlite:///{db}"
    (tmp_path / "resume-baseline.json").write_text(
        json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}})
    )
    options = SearchOptions(budget="1m", model="builtin:tiny-t5", storage=url, study="kept", finalists=0)
    request, explicit = prepare_request(options, url, CLI)
    assert resolve(request, explicit, Store(url))[1] is False  # created
    before = _snapshot(db)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    filled = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    monkeypatch.setattr(
        sys, "argv", ["tuner", "search", "--budget", "1m", "--study", "kept", "--storage", url, *filled]
    )
    with pytest.raises(SystemExit) as exit_info:
        tuner_main()
    line = _one_error_line(capsys.readouterr().err)
    assert exit_info.value.code == 2 and re.search(expect, line), line
    assert _snapshot(db) == before


def test_resume_on_another_library_version_names_it_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The study records the host it was measured on (tuner.session.host_record); a worker with another torch is
    refused before its first probe, in one line naming the field, both versions and --study."""
    import dataclasses

    from tuner.session.host_record import KEY, this_host
    from tuner.session.options import CLI, SearchOptions, prepare_request
    from tuner.session.session import resolve
    from tuner.storage.store import Store

    db = tmp_path / "host.db"
    url = f"sqlite:///{db}"
    store = Store(url)
    options = SearchOptions(budget="1m", model="builtin:tiny-t5", storage=url, study="kept", finalists=0)
    request, explicit = prepare_request(options, url, CLI)
    assert resolve(request, explicit, store)[1] is False  # created
    here = this_host()
    store.record_in_definition("kept", KEY, dataclasses.replace(here, torch="1.0.0").to_dict())
    before = _snapshot(db)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setattr(sys, "argv", ["tuner", "search", "--budget", "1m", "--study", "kept", "--storage", url])
    with pytest.raises(SystemExit) as exit_info:
        tuner_main()
    line = _one_error_line(capsys.readouterr().err)
    assert exit_info.value.code == 2, line
    assert re.search(rf"measured with torch 1\.0\.0 but this host has {re.escape(here.torch)}.*--study", line), line
    assert _snapshot(db) == before


# -- issue 13 ("nothing let in"): limits at parse time, markup from user text, secrets in the storage URL -------------
# Each fails on the code before issue 13: a traceback (OverflowError, MarkupError, MemoryError), a search that starts
# over a space no worker can enumerate, or the storage password in the error line.
SECRET = "hunter2-issue13"
ISSUE13_FILES = {
    "markup_alloc.yaml": 'micro_batch_size: [2]\nzero_stage: [0]\nalloc_conf: ["[/]"]\n',
    "huge_range.yaml": "micro_batch_size: {low: 1, high: 1000000000000000000, scale: linear}\n",
    "huge_grid.yaml": "micro_batch_size: {low: 1, high: 64, scale: linear}\n"
    "max_length: {low: 1, high: 64, scale: linear}\n"
    "eval_batch_size: {low: 1, high: 64, scale: linear}\n",
    "primes.yaml": "micro_batch_size: [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61]\n"
    "max_length: [64]\n",
}
ISSUE13_CLI: list[Cli] = [
    Cli("i13-budget-markup", ["search", "--budget", "[/]"], r"budget '\[/\]' is not a duration"),
    Cli("i13-budget-markup-bold", ["search", "--budget", "[bold]2h"], r"budget '\[bold\]2h'"),
    Cli("i13-alloc-conf-markup", ["search", "--budget", "1m", "--space", "{tmp}/markup_alloc.yaml"], r"'\[/\]'.*alloc"),
    Cli("i13-device-memory-1e400", ["search", "--budget", "1m", "--device-memory", "1e400"], r"memory size '1e400'"),
    Cli("i13-device-memory-exp", ["search", "--budget", "1m", "--device-memory", "1e99999999999B"], r"above 1 PiB"),
    Cli("i13-world-4096", ["search", "--budget", "1m", "--world-size", "4096"], r"--world-size 4096 is above 64"),
    Cli(
        "i13-range-1e18", ["search", "--budget", "1m", "--space", "{tmp}/huge_range.yaml"], r"micro_batch_size.*values"
    ),
    Cli("i13-grid", ["search", "--budget", "1m", "--space", "{tmp}/huge_grid.yaml"], r"\d+ configs; at most 100000"),
    Cli(
        "i13-default-batch", ["search", "--budget", "1m", "--space", "{tmp}/primes.yaml"], r"global batch \d+ is above"
    ),
    Cli(
        "i13-storage-password",
        ["trials", "--storage", f"postgresql+psycopg://nobody:{SECRET}@127.0.0.1:9/nodb?connect_timeout=2"],
        r"cannot reach storage postgresql\+psycopg://nobody:\*\*\*@",
    ),
    Cli(
        "i13-storage-query-password",
        ["trials", "--storage", f"postgresql+psycopg://nobody@127.0.0.1:9/nodb?connect_timeout=2&password={SECRET}"],
        r"cannot reach storage .*password=\*\*\*",
    ),
    Cli("i13-storage-bad-url-password", ["trials", "--storage", f"nosuchdb://u:{SECRET}@h/d"], r"unknown database"),
]


@pytest.fixture(scope="module")
def world13(world: dict[str, Any]) -> dict[str, Any]:
    for name, text in ISSUE13_FILES.items():
        (world["tmp"] / name).write_text(text)
    return world


@pytest.mark.parametrize("case", ISSUE13_CLI, ids=lambda c: c.id)
def test_issue13_cli_bad_input(
    case: Cli,
    world13: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TUNER_STORAGE", world13["url"])
    monkeypatch.delenv("TUNER_API_TOKEN", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("COLUMNS", "400")
    before = _snapshot(world13["db"])
    monkeypatch.setattr(sys, "argv", ["tuner", *(_fill(a, world13) for a in case.argv)])
    with pytest.raises(SystemExit) as exit_info:
        tuner_main()
    out = capsys.readouterr()
    line = _one_error_line(out.err)
    assert exit_info.value.code == 2, (exit_info.value.code, line)
    assert re.search(case.expect, line, re.IGNORECASE), line
    assert SECRET not in out.err + out.out
    assert _snapshot(world13["db"]) == before, "stored data changed"
    assert not list(tmp_path.iterdir()), "a bad command left files behind"


# World size above the visible GPUs is tuner.probing.gpus.check_world_size (issue 12: as CUDA reads
# CUDA_VISIBLE_DEVICES, MIG included; on a host without GPUs the ranks run on the emulated CPU device, nothing to
# check): tests/tuner/probing/test_gpu_host.py.


ISSUE13_API: list[Api] = [
    Api("i13-api-best-no-study", "GET", "/best-config", r"study=", (422,)),
    Api(
        "i13-api-flops-profiler",
        "POST",
        "/studies",
        r"baseline\.flops_profiler",
        body={
            "name": "n13",
            "baseline": {
                "train_micro_batch_size_per_gpu": 2,
                "flops_profiler": {"enabled": True, "output_file": "/etc/x"},
            },
        },
        headers=AUTH,
    ),
    Api(
        "i13-api-lr",
        "POST",
        "/studies",
        r"baseline\.optimizer\.params\.lr",
        body={
            "name": "n13",
            "baseline": {
                "train_micro_batch_size_per_gpu": 2,
                "optimizer": {"type": "AdamW", "params": {"lr": 1000}},
            },
        },
        headers=AUTH,
    ),
    Api(
        "i13-api-range",
        "POST",
        "/studies",
        r"micro_batch_size",
        body={"name": "n13", "space": {"micro_batch_size": {"low": 1, "high": 10**18, "scale": "linear"}}},
        headers=AUTH,
    ),
    Api(
        "i13-api-device-memory",
        "POST",
        "/studies",
        r"device_memory",
        body={"name": "n13", "device_memory": "1e400GiB"},
        headers=AUTH,
    ),
    Api("i13-api-world", "POST", "/studies", r"world_size", body={"name": "n13", "world_size": 4096}, headers=AUTH),
]


@pytest.fixture(scope="module")
def world13_api(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A storage of its own: test_the_real_executable_agrees runs the installed `tuner` without this checkout on
    PYTHONPATH, which may be another tree's tuner that upgrades the shared storage past this one's schema."""
    db = tmp_path_factory.mktemp("bad13") / "tuner.db"
    url = f"sqlite:///{db}"
    populate_study(url, "rep")
    return {"db": db, "url": url}


@pytest.mark.parametrize("case", ISSUE13_API, ids=lambda c: c.id)
def test_issue13_api_bad_input(case: Api, world13_api: dict[str, Any]) -> None:
    test_api_bad_input(case, world13_api)
