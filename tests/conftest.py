"""Shared fixtures for every test package.

- ``sqlite_url``: a fresh SQLite file URL in the test's tmp dir.
- ``postgres_url``: one throwaway database ``tuner_test_<random>`` on the real PostgreSQL at 127.0.0.1:5432
  (user postgres), created once per test session and dropped at its end. Share it only with unique study names.
- ``new_postgres_url()`` (factory fixture): one more fresh throwaway database, dropped at session end.
- ``storage_url``: parametrized over ``sqlite`` and ``postgres``; each test gets an empty storage of that kind.
- ``tuner_server``: factory starting a real `tuner serve` process (uvicorn) on a free port; stopped at teardown.

PostgreSQL is part of CI (.ci/run). Where none answers, scripts/test.sh starts a throwaway cluster
(scripts/throwaway-pg.sh; TUNER_TEST_PG_ADMIN names it, tests/helpers/pg_admin.py reads it); run pytest by hand
without a server and these fixtures fail with one line saying so (they do not skip, so a CI without the server cannot
pass silently). TUNER_TEST_POSTGRES=skip skips them on purpose. Chromium (tests/e2e/test_report_render.py) follows the
same rule: TUNER_TEST_CHROMIUM=skip.

Shared helpers are the package tests/helpers (``from tests.helpers.servers import start_server``): tests/ is a package
(tests/__init__.py), so pytest's default prepend import mode puts the repository root on sys.path when it imports this
conftest (``tests.conftest``), before any test module; the test folders below have no __init__.py and import their
modules by file name as before. A subprocess that needs the helpers runs with the repository root as its working
directory. Nothing inserts into sys.path.
- tests/helpers/servers.py: `tuner` processes, free ports, waiting for HTTP, a clean env.
- tests/helpers/pg_admin.py: where the tests' PostgreSQL is.
- tests/helpers/composefile.py: docker-compose.yml read as `docker compose` does; a service's command parsed by the
  real CLI.
- tests/helpers/sample_storage.py: ``SampleStudy``, the one builder of stored studies (probe rows and Optuna trials
  through the search's own writers), and the API tests' study (``populate``).
- tests/helpers/report_study.py: ``populate_study``, a report-shaped study (OOMs, an imbalanced 2-rank probe, hostile
  text), built with ``SampleStudy``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator

import pytest

from tests.helpers.pg_admin import PG_ADMIN, PG_HOST
from tests.helpers.pg_admin import admin_exec as _admin_exec


@pytest.fixture(scope="session")
def new_postgres_url() -> Iterator[Callable[[], str]]:
    created: list[str] = []

    def make() -> str:
        if os.environ.get("TUNER_TEST_POSTGRES") == "skip":
            pytest.skip("TUNER_TEST_POSTGRES=skip")
        import psycopg

        name = f"tuner_test_{secrets.token_hex(6)}"
        try:
            _admin_exec(f'CREATE DATABASE "{name}"')
        except psycopg.OperationalError as err:
            pytest.fail(
                f"PostgreSQL at {PG_ADMIN} unreachable ({str(err).strip().splitlines()[0]}); start it "
                "or set TUNER_TEST_POSTGRES=skip",
                pytrace=False,
            )
        created.append(name)
        return f"postgresql+psycopg://{PG_HOST}/{name}"

    yield make
    for name in created:
        _admin_exec(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def postgres_url(new_postgres_url: Callable[[], str]) -> str:
    return new_postgres_url()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def storage_url(request: pytest.FixtureRequest, tmp_path, new_postgres_url: Callable[[], str]) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tuner.db'}"
    return new_postgres_url()


@pytest.fixture
def tuner_server() -> Iterator[Callable[..., str]]:
    """Factory: ``start(storage_url, *extra_args, env={...})`` runs `tuner serve` (see tests/helpers/servers.py) on a
    free loopback port, waits for it to answer, and returns its base URL. Every server started is stopped at
    teardown."""
    from tests.helpers.servers import start_server, stop

    procs: list = []

    def start(storage: str, *extra: str, env: dict[str, str] | None = None) -> str:
        proc, base = start_server(storage, *extra, env=env)
        procs.append(proc)
        return base

    yield start
    for proc in procs:
        stop(proc)
