"""Failures answer JSON: storage down -> 503 (before and after it was up), never a 5xx for bad input."""

from __future__ import annotations

import socket

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.helpers.pg_admin import PG_ADMIN
from tuner.settings import Settings


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("path", ["/health", "/studies", "/studies/x", "/studies/x/trials", "/best-config?study=x"])
def test_unreachable_postgres_is_503_json(path) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{_closed_port()}/tuner"
    client = TestClient(create_app(Settings(storage=url)))
    r = client.get(path)
    assert r.status_code == 503
    assert "cannot reach storage" in r.json()["detail"]


def test_unopenable_sqlite_is_503_json(tmp_path) -> None:
    client = TestClient(create_app(Settings(storage=f"sqlite:///{tmp_path}/missing/dir/tuner.db")))
    r = client.get("/studies")
    assert r.status_code == 503
    assert r.json()["detail"]


@pytest.mark.postgres
def test_database_dropped_while_serving_turns_into_503(new_postgres_url) -> None:
    from tests.helpers.sample_storage import populate

    url = new_postgres_url()
    populate(url, "s")
    client = TestClient(create_app(Settings(storage=url)), raise_server_exceptions=False)
    assert client.get("/best-config", params={"study": "s"}).status_code == 200
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    for path in ("/best-config?study=s", "/studies/s", "/studies/s/trials", "/health"):
        r = client.get(path)
        assert r.status_code == 503, (path, r.text)
        assert r.json()["detail"]


def test_malformed_storage_url_is_503_json() -> None:
    client = TestClient(create_app(Settings(storage="not a url")))
    r = client.get("/health")
    assert r.status_code == 503
    assert "not a SQLAlchemy URL" in r.json()["detail"]


WEIRD = [
    "/studies/%00",
    "/studies/..%2F..%2Fetc%2Fpasswd",
    "/studies/" + "z" * 5000,
    "/best-config?study=",
    "/best-config?format=",
    "/best-config?raw=maybe",
    "/studies/t5-demo/trials?offset=99999999999999999999",
    "/studies/t5-demo/trials?limit=1e3",
    "/studies/t5-demo/trials?offset=%00",
    "/best-config?study=a&study=b",
    "/studies/%E2%80%AE",
    "/nope",
    "/studies/t5-demo/trials/1",
]


@pytest.mark.parametrize("path", WEIRD)
def test_strange_requests_are_never_5xx(client, path) -> None:
    r = client.get(path)
    assert 200 <= r.status_code < 500, (path, r.status_code, r.text[:200])
    assert "detail" in r.json() or r.status_code == 200


def test_wrong_method_is_405_json(client) -> None:
    r = client.delete("/studies/t5-demo")
    assert r.status_code == 405
    assert r.json()["detail"]
