"""Several processes first-using one database at once (workers starting together, the API beside a search): a fresh
SQLite file, a fresh PostgreSQL database, and a SQLite file made before alembic that they all upgrade at once."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PRE_ALEMBIC_DB = Path(__file__).parent / "data" / "pre_alembic_fb0cbe4.db"


def _first_use_at_once(url: str, n: int = 6) -> None:
    code = (
        "from tuner.storage import Store, optuna_storage; "
        f"Store({url!r}); optuna_storage({url!r}, heartbeat_interval=None, grace_period=None); print('ok')"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    results = [(p.communicate(timeout=300), p.returncode) for p in procs]
    failures = [err[-3000:] for (_out, err), rc in results if rc != 0]
    assert not failures, failures
    assert all(out.strip() == "ok" for (out, _err), _rc in results)


def test_concurrent_first_use_of_one_sqlite_file_all_succeed(tmp_path: Path) -> None:
    _first_use_at_once(f"sqlite:///{tmp_path / 'race.db'}")


@pytest.mark.postgres
def test_concurrent_first_use_of_one_postgres_database_all_succeed(new_postgres_url) -> None:
    _first_use_at_once(new_postgres_url())


def test_concurrent_first_use_of_a_pre_alembic_file_upgrades_it_once(tmp_path: Path) -> None:
    from tuner.storage import Store, migrations
    from tuner.storage.db import schema_revision

    path = tmp_path / "old.db"
    shutil.copy(PRE_ALEMBIC_DB, path)
    url = f"sqlite:///{path}"
    _first_use_at_once(url, n=4)
    store = Store(url)
    assert schema_revision(store.engine) == migrations.head()
    assert len(store.probes("old-demo")) == 8
