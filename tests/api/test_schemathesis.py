"""Property-based requests generated from the API's own OpenAPI schema (schemathesis, in-process ASGI): whatever the
parameters and bodies, with or without the token, the server never answers 5xx.

The schema is loaded at import (schemathesis' lazy fixture loader does not work with pytest 9); the app opens its
storage on the first request, so the module fixture below populates the database before any case runs."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup, ServerError

from api.app import create_app
from tests.helpers.sample_storage import define_only, populate
from tuner.settings import Settings
from tuner.storage.db import get_engine

TOKEN = "schemathesis-token"
_DIR = Path(tempfile.mkdtemp(prefix="tuner-schemathesis-"))
URL = f"sqlite:///{_DIR / 'tuner.db'}"
APP = create_app(Settings(storage=URL, api_token=TOKEN))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,  # the same cases on every run: a CI failure reproduces locally
    database=None,  # no .hypothesis/ folder in the work tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module", autouse=True)
def populated() -> Iterator[None]:
    populate(URL, "t5-demo")
    define_only(URL, "fresh")
    yield
    get_engine(URL).dispose()
    shutil.rmtree(_DIR, ignore_errors=True)


def test_schema_covers_every_route() -> None:
    paths = set(APP.openapi()["paths"])
    assert {"/health", "/studies", "/studies/{name}", "/studies/{name}/trials", "/best-config"} <= paths


@schema.parametrize()
@SETTINGS
def test_no_server_errors_without_token(case) -> None:
    case.call_and_validate(checks=[not_a_server_error])


@schema.include(method="POST").parametrize()
@settings(SETTINGS, max_examples=120)
def test_no_server_errors_on_authorised_writes(case) -> None:
    case.call_and_validate(checks=[not_a_server_error], headers={"Authorization": f"Bearer {TOKEN}"})


def test_the_demo_study_survived_the_writes() -> None:
    """Fuzzed POSTs may add studies, but never alter or remove the existing ones' probes."""
    with get_engine(URL).connect() as conn:
        probes = conn.execute(sa.text("SELECT count(*) FROM tuner_probes WHERE study_name='t5-demo'")).scalar()
        names = {r[0] for r in conn.execute(sa.text("SELECT name FROM tuner_studies"))}
    assert probes and probes > 0
    assert {"t5-demo", "fresh"} <= names


def test_the_harness_finds_a_planted_server_error() -> None:
    """The positive control: the same generation + check on an app with a planted 500 fails."""
    planted = FastAPI()

    @planted.get("/boom")
    def boom(x: int) -> JSONResponse:
        return JSONResponse({"x": x}, status_code=500 if x > 3 else 200)

    strategy = schemathesis.openapi.from_asgi("/openapi.json", planted)["/boom"]["GET"].as_strategy()

    @given(strategy)
    @settings(SETTINGS, max_examples=50)
    def run(case) -> None:
        case.call_and_validate(checks=[not_a_server_error])

    with pytest.raises(FailureGroup) as info:
        run()
    assert any(isinstance(e, ServerError) for e in info.value.exceptions)
