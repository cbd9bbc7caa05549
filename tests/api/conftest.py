"""API fixtures: a storage populated through the search's own writers, on SQLite and on the real PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.helpers.sample_storage import define_only, populate
from tuner.settings import Settings

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def populated_url(request: pytest.FixtureRequest, tmp_path_factory, new_postgres_url: Callable[[], str]) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'tuner.db'}"
    else:
        url = new_postgres_url()
    populate(url, "t5-demo")
    define_only(url, "fresh")  # created last: the "most recent" study
    return url


@pytest.fixture(scope="module")
def client(populated_url: str) -> TestClient:
    return TestClient(create_app(Settings(storage=populated_url, api_token=TOKEN)))
