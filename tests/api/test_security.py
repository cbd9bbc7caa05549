"""Security: the write token (constant-time compare), no public bind without a token, validated names, no injection
through endpoints or stored fields, and secrets (token, database password) never in logs or GET responses.
Real `tuner serve` processes over real HTTP, a real PostgreSQL for the password case."""

from __future__ import annotations

import hmac
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

import api.deps
from api.app import create_app
from tests.helpers.sample_storage import populate
from trials.contract import free_port
from tuner.settings import Settings
from tuner.storage.db import get_engine

TUNER = str(Path(sys.executable).with_name("tuner"))
TOKEN = "tok-" + "Q7x9" * 8


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    env.update(HOME=str(tmp), COLUMNS="300", **extra)
    return env


def _http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


class Server:
    def __init__(self, tmp: Path, storage: str, host: str = "127.0.0.1", **env: str) -> None:
        self.port = free_port()
        self.log = tmp / f"serve-{self.port}.log"
        self.proc = subprocess.Popen(
            [TUNER, "serve", "--storage", storage, "--host", host, "--port", str(self.port)],
            env=_env(tmp, **env),
            cwd=tmp,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(self.base + "/openapi.json", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"tuner serve did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.3)

    def stop(self) -> str:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return self.log.read_text()


@pytest.fixture(scope="module")
def sqlite_demo(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('sec') / 'tuner.db'}"
    populate(url, "t5-demo")
    return url


# -- the token ---------------------------------------------------------------------------------------------------------
def test_token_is_compared_in_constant_time(sqlite_demo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every token check goes through hmac.compare_digest (a spy around the real function records the calls)."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(api.deps.hmac, "compare_digest", spy)
    client = TestClient(create_app(Settings(storage=sqlite_demo, api_token=TOKEN)))
    wrong = client.post("/studies", json={"name": "sec-wrong"}, headers={"Authorization": "Bearer " + TOKEN[:-1] + "x"})
    assert wrong.status_code == 401 and TOKEN not in wrong.text
    assert len(calls) == 1 and TOKEN.encode() in calls[0]
    right = client.post("/studies", json={"name": "sec-right"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert right.status_code == 201 and len(calls) == 3  # api.guard before the body, then the route's own check
    assert TOKEN not in right.text


def test_writes_refused_without_a_server_token(sqlite_demo: str) -> None:
    client = TestClient(create_app(Settings(storage=sqlite_demo, api_token=None)))
    for auth in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer anything"}):
        resp = client.post("/studies", json={"name": "no-token-server"}, headers=auth)
        assert resp.status_code in (401, 403), resp.text
    assert client.get("/studies/no-token-server").status_code == 404


# -- binding -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.org"])
def test_serve_refuses_public_bind_without_token(host: str, tmp_path: Path, sqlite_demo: str) -> None:
    done = subprocess.run(
        [TUNER, "serve", "--host", host, "--port", str(free_port()), "--storage", sqlite_demo],
        env=_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "refusing to serve" in lines[0] and "TUNER_API_TOKEN" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_serve_binds_public_with_token_and_loopback_without(tmp_path: Path, sqlite_demo: str) -> None:
    public = Server(tmp_path, sqlite_demo, host="0.0.0.0", TUNER_API_TOKEN=TOKEN)
    try:
        status, _ = _http("GET", public.base + "/health")
        assert status == 200
    finally:
        log = public.stop()
    assert TOKEN not in log
    local = Server(tmp_path, sqlite_demo)
    try:
        status, body = _http("POST", local.base + "/studies", {"name": "x"}, {"Authorization": "Bearer guess"})
        assert status == 403 and "writes are disabled" in body
    finally:
        local.stop()


# -- names and injection -----------------------------------------------------------------------------------------------
INJECTIONS = [
    "x'; DROP TABLE tuner_probes; --",
    "$(touch /tmp/tuner-pwned)",
    "`id`",
    "../../etc/passwd",
    "a\nb",
    "<script>alert(1)</script>",
    "x" * 129,
    "",
    "name with spaces",
    "%00",
]


@pytest.mark.parametrize("name", INJECTIONS, ids=range(len(INJECTIONS)))
def test_names_are_validated_and_inject_nothing(name: str, sqlite_demo: str) -> None:
    engine = get_engine(sqlite_demo)
    with engine.connect() as conn:
        before = conn.execute(sa.text("SELECT count(*) FROM tuner_probes")).scalar()
    client = TestClient(create_app(Settings(storage=sqlite_demo, api_token=TOKEN)), raise_server_exceptions=False)
    created = client.post("/studies", json={"name": name}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert created.status_code == 422, created.text
    quoted = urllib.parse.quote(name, safe="")
    gets = [client.get("/best-config", params={"study": name})]
    if name:  # "/studies/" is the list itself
        gets += [client.get("/studies/" + quoted), client.get("/studies/" + quoted + "/trials")]
    for resp in gets:
        assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
        assert "<script>" not in resp.text
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM tuner_probes")).scalar() == before
    assert not Path("/tmp/tuner-pwned").exists()


HOSTILE_MODELS = [
    "builtin:tiny-t5; touch {pwned}",
    "$(touch {pwned})",
    "{pwned}/../../etc",
    "`touch {pwned}`",
    "x" * 600,
]


@pytest.mark.parametrize("model", HOSTILE_MODELS, ids=range(len(HOSTILE_MODELS)))
def test_hostile_model_sources_are_refused_by_the_api(model: str, tmp_path: Path, sqlite_demo: str) -> None:
    pwned = tmp_path / "pwned"
    client = TestClient(create_app(Settings(storage=sqlite_demo, api_token=TOKEN)), raise_server_exceptions=False)
    resp = client.post(
        "/studies",
        json={"name": "hostile-api", "model": model.format(pwned=pwned)},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert 400 <= resp.status_code < 500 and "\n" not in resp.json()["detail"], resp.text
    assert client.get("/studies/hostile-api").status_code == 404
    assert not pwned.exists()


@pytest.mark.slow
def test_a_tampered_stored_definition_is_data_not_a_command(tmp_path: Path) -> None:
    """A definition written straight into the table (bypassing the API's checks) with a shell string as the model:
    a worker joining the study passes it along as data (argv lists, a JSON config file), never to a shell."""
    from tuner.storage.store import Store

    url = f"sqlite:///{tmp_path / 'tampered.db'}"
    pwned = tmp_path / "pwned"
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch_size: [1]\nmax_length: [16]\nengine: [torch]\nzero_stage: [0]\n")
    # a real definition first (what `tuner search` writes), then the model field replaced by a shell string
    first = subprocess.run(
        [
            TUNER,
            "search",
            "--study",
            "tampered",
            "--storage",
            url,
            "--budget",
            "1s",
            "--space",
            str(space),
            "--global-batch",
            "1",
        ],
        env=_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    store = Store(url)
    definition = store.study_definition("tampered")
    assert definition is not None
    definition["model"] = {"source": f"builtin:tiny-t5; touch {pwned}", "overrides": {}}
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE tuner_studies SET definition=:d WHERE name='tampered'"), {"d": json.dumps(definition)}
        )
    done = subprocess.run(
        [TUNER, "search", "--study", "tampered", "--storage", url, "--budget", "5m", "--n-trials", "1"],
        env=_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not pwned.exists()
    if done.returncode == 2:  # refused on one line
        assert len([ln for ln in done.stderr.splitlines() if ln.strip()]) == 1, done.stderr
    else:  # or probed: the probe failed on the model text, recorded as an error
        assert done.returncode == 0, done.stderr[-2000:]
        statuses = {r.status for r in store.probes("tampered")}
        assert statuses <= {"error"}, statuses


# -- secrets -----------------------------------------------------------------------------------------------------------
@pytest.mark.postgres
def test_secrets_never_in_logs_or_get_responses(tmp_path: Path, new_postgres_url: Callable[[], str]) -> None:
    password = "pw-" + "Zk3" * 6
    url = new_postgres_url().replace("postgres@", f"postgres:{password}@", 1)
    populate(url, "t5-demo")
    server = Server(tmp_path, url, TUNER_API_TOKEN=TOKEN)
    bodies: list[str] = []
    try:
        for path in (
            "/health",
            "/studies",
            "/studies/t5-demo",
            "/studies/t5-demo/trials",
            "/best-config?study=t5-demo",
            "/best-config?study=t5-demo&format=deepspeed",
            "/openapi.json",
            "/studies/nope",
            "/docs",
        ):
            status, body = _http("GET", server.base + path)
            assert status < 500, (path, status, body)
            bodies.append(body)
        for auth in (f"Bearer wrong-{TOKEN}", f"Bearer {TOKEN}", "Basic " + TOKEN):
            status, body = _http(
                "POST",
                server.base + "/studies",
                {"name": "sec-pg", "model": "builtin:tiny-t5"},
                {"Authorization": auth},
            )
            assert status in (201, 401, 409), (status, body)
            bodies.append(body)
        status, body = _http("GET", server.base + "/studies/sec-pg")
        assert status == 200
        bodies.append(body)
    finally:
        log = server.stop()
    for body in bodies:
        assert password not in body and TOKEN not in body
    assert password not in log and TOKEN not in log, log[-2000:]
    health = json.loads(bodies[0])
    assert "***" in health["storage"] or password not in health["storage"]
    with get_engine(url).connect() as conn:
        stored = json.dumps([list(map(str, r)) for r in conn.execute(sa.text("SELECT * FROM tuner_studies"))])
    assert TOKEN not in stored and password not in stored
