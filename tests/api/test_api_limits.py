"""Issue 13, point 7 and "reads that scale": a write's token is checked and an oversized body refused (413) before the
server reads the body, over real HTTP (`tuner serve`, raw sockets); the API holds a bounded pool with connect timeouts
(real PostgreSQL); a trials page is paged, filtered and counted in SQL."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from optuna.distributions import IntDistribution

from api.app import create_app
from api.guard import MAX_BODY_BYTES
from tests.helpers.sample_storage import SampleStudy, populate
from tuner.settings import Settings
from tuner.storage import Store
from tuner.storage.read_pool import MAX_OVERFLOW, POOL_SIZE

TOKEN = "s3cret-token-for-tests"


def _raw(base: str, head: str, body: bytes = b"", timeout: float = 30.0) -> tuple[int, dict]:
    """Sends ``head`` (and ``body``, possibly less than its Content-Length promises) on a fresh connection; returns the
    status and JSON body of the answer, which must come without the rest of the body ever being sent."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status_line, rest = data.split(b"\r\n", 1)
    return int(status_line.split()[1]), json.loads(rest.split(b"\r\n\r\n", 1)[1] or b"{}")


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _post_head(length: int, token: str | None = TOKEN, chunked: bool = False) -> str:
    lines = ["POST /studies HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}")
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    return "\r\n".join(lines) + "\r\n"


@pytest.fixture
def server(sqlite_url: str, tuner_server: Callable[..., str]) -> tuple[str, str]:
    return tuner_server(sqlite_url, env={"TUNER_API_TOKEN": TOKEN}), sqlite_url


def test_a_write_without_the_token_is_refused_before_its_body_is_read(server) -> None:
    base, url = server
    for token, detail in ((None, "missing bearer token"), ("guess", "invalid bearer token")):
        status, body = _raw(base, _post_head(10_000, token), b'{"name": "x"')  # 10 kB promised, 12 bytes sent
        assert status == 401 and detail in body["detail"], body
    assert Store(url).study_definition("x") is None


def test_a_declared_oversized_body_is_413_before_it_is_read(server) -> None:
    base, url = server
    status, body = _raw(base, _post_head(100 * MAX_BODY_BYTES), b'{"name": "big"')
    assert status == 413 and "too large" in body["detail"], body
    assert Store(url).study_definition("big") is None


def test_a_chunked_body_past_the_limit_is_413(server) -> None:
    base, url = server
    blob = json.dumps({"name": "chunky", "training_args": {"x": "y" * (2 * MAX_BODY_BYTES)}}).encode()

    def chunks():
        for i in range(0, len(blob), 16384):
            yield blob[i : i + 16384]

    r = httpx.post(
        base + "/studies",
        content=chunks(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413 and "too large" in r.json()["detail"], r.text
    ok = httpx.post(base + "/studies", json={"name": "small"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 201, ok.text
    assert Store(url).study_definition("chunky") is None and Store(url).study_definition("small") is not None


def test_a_server_without_token_refuses_writes_before_the_body(sqlite_url, tuner_server) -> None:
    base = tuner_server(sqlite_url)
    status, body = _raw(base, _post_head(10_000, None), b"{")
    assert status == 403 and "TUNER_API_TOKEN" in body["detail"]


@pytest.mark.postgres
def test_the_api_holds_a_bounded_pool_under_100_concurrent_reads(new_postgres_url, tuner_server) -> None:
    url = new_postgres_url()
    populate(url, "t5-demo")
    base = tuner_server(url)
    database = url.rsplit("/", 1)[1]
    admin = sa.create_engine(url.rsplit("/", 1)[0] + "/postgres", poolclass=sa.pool.NullPool)
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        q = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND application_name NOT LIKE 'psql%'")
        with admin.connect() as conn:
            while not done.is_set():
                seen.append(int(conn.execute(q, {"d": database}).scalar_one()))
                time.sleep(0.05)

    def hit(i: int) -> None:
        path = ("/studies/t5-demo", "/studies/t5-demo/trials", "/best-config?study=t5-demo", "/studies")[i % 4]
        with httpx.Client(base_url=base, timeout=120) as http:
            for _ in range(5):
                assert http.get(path).status_code == 200

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        clients = [threading.Thread(target=hit, args=(i,)) for i in range(100)]
        for t in clients:
            t.start()
        for t in clients:
            t.join()
    finally:
        done.set()
        watcher.join()
        admin.dispose()
    assert max(seen) >= 1
    assert max(seen) <= POOL_SIZE + MAX_OVERFLOW, max(seen)  # 60 with the search's pools (10 + 20, twice)


def test_a_database_that_accepts_but_never_answers_is_503_not_a_hang() -> None:
    """A PostgreSQL address whose TCP port accepts and then says nothing (a dead server behind a proxy): without a
    connect timeout every request would wait forever."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        client = TestClient(create_app(Settings(storage=f"postgresql+psycopg://postgres@127.0.0.1:{port}/x")))
        answer: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: answer.append(client.get("/health")), daemon=True)
        worker.start()
        worker.join(timeout=120)
    assert answer, "the request hung on a silent database"
    assert answer[0].status_code == 503 and "cannot reach storage" in answer[0].json()["detail"]


# -- reads that scale --------------------------------------------------------------------------------------------------
def test_a_trials_page_filters_by_state_and_counts_in_sql(storage_url) -> None:
    populate(storage_url, "t5-demo")
    client = TestClient(create_app(Settings(storage=storage_url)))
    pruned = client.get("/studies/t5-demo/trials", params={"state": "PRUNED"}).json()
    assert pruned["total"] == 2 and pruned["state"] == "PRUNED"
    assert [t["number"] for t in pruned["trials"]] == [1, 4] and {t["state"] for t in pruned["trials"]} == {"PRUNED"}
    complete = client.get("/studies/t5-demo/trials", params={"state": "COMPLETE", "limit": 2, "offset": 1}).json()
    assert complete["total"] == 4 and [t["number"] for t in complete["trials"]] == [2, 3]
    assert client.get("/studies/t5-demo/trials", params={"state": "DONE"}).status_code == 422


def _grow(url: str, study: str, n: int) -> None:
    """``n`` more trials with a probe row each, through the search's writers."""
    sample = SampleStudy(url, study, distributions={"micro_batch_size": IntDistribution(1, 8)})
    base = sample.store.probes(study)[0]
    for number in range(len(sample.study.trials), len(sample.study.trials) + n):
        sample.trial({"micro_batch_size": 2}, "ok", 1.0)
        sample.again(base, trial_number=number, config_key=f"g{number}")


def test_a_trials_page_reads_the_same_rows_whatever_the_size_of_the_study(sqlite_url) -> None:
    """The page's SQL is the same statements on 8 trials and on 308, and no statement reads the whole study: the
    trials come LIMITed, their probe rows by trial number (before, every trial and probe row of the study was loaded
    for every page)."""
    populate(sqlite_url, "t5-demo")
    app = create_app(Settings(storage=sqlite_url))
    client = TestClient(app)
    client.get("/health")
    engine = app.state.services.store().engine
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda c, cur, sql, *a: statements.append(sql))

    def page_sql() -> list[str]:
        statements.clear()
        r = client.get("/studies/t5-demo/trials", params={"limit": 5, "offset": 2})
        assert r.status_code == 200 and len(r.json()["trials"]) == 5
        return [sql for sql in statements if not sql.startswith("PRAGMA")]  # the one-off "has Optuna's tables?"

    small = page_sql()
    _grow(sqlite_url, "t5-demo", 300)
    large = page_sql()
    assert set(small) == set(large) and len(large) <= 12, sorted(set(large) ^ set(small))
    for sql in large:
        if "FROM tuner_probes" in sql:
            assert "IN (" in sql or "count(" in sql, sql
        if "FROM trials" in sql and "count(" not in sql:
            assert "LIMIT" in sql or "IN (" in sql, sql


# -- issue 24 §3: the limit cannot be bypassed by framing, a slow body is cut off, the head is bounded ---------------
def test_content_length_with_chunked_transfer_encoding_is_400_before_the_body(server) -> None:
    """h11 follows the chunks and ignores the length: the guard took ``Content-Length: 5`` for the size while a large
    chunked body was buffered and parsed. Both headers together are refused before a byte of the body is read."""
    base, url = server
    blob = json.dumps({"name": "smuggled", "training_args": {"x": "y" * (2 * MAX_BODY_BYTES)}}).encode()
    head = _post_head(5, chunked=True).replace(
        "Transfer-Encoding: chunked", "Transfer-Encoding: chunked\r\nContent-Length: 5"
    )
    body = f"{len(blob):x}\r\n".encode() + blob + b"\r\n0\r\n\r\n"
    status, answer = _raw(base, head, body[:1000])  # the rest never sent: the answer comes without it
    assert status == 400 and "Content-Length and Transfer-Encoding" in answer["detail"], answer
    assert Store(url).study_definition("smuggled") is None


def test_a_body_that_does_not_arrive_in_time_is_408(sqlite_url: str, tuner_server: Callable[..., str]) -> None:
    base = tuner_server(sqlite_url, env={"TUNER_API_TOKEN": TOKEN, "TUNER_API_BODY_TIMEOUT_S": "1"})
    status, answer = _raw(base, _post_head(1000), b'{"name": "slow"')  # 1000 bytes promised, 15 sent, then nothing
    assert status == 408 and "not received within 1 s" in answer["detail"], answer
    assert Store(sqlite_url).study_definition("slow") is None


def test_a_long_query_string_is_414_and_large_headers_431(sqlite_url: str) -> None:
    client = TestClient(create_app(Settings(storage=sqlite_url, api_token=TOKEN)))
    long_query = client.get("/studies", params={"x": "q" * 9000})
    assert long_query.status_code == 414 and "query string too long" in long_query.json()["detail"]
    many = {f"x-h{i}": "v" * 1000 for i in range(20)}
    large = client.get("/studies", headers=many)
    assert large.status_code == 431 and "headers too large" in large.json()["detail"]
    assert client.get("/studies", params={"x": "q" * 100}).status_code == 200
