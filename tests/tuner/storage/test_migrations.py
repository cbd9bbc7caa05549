"""tuner's tables through alembic (tuner/storage/migrations): head equals schema.metadata and today's pre-alembic
tables, Optuna's alembic history in the same database is left alone, a database made before alembic upgrades in place
with its rows, and a newer schema is refused in one line. Real SQLite files and a real PostgreSQL, no mocks."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import optuna
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from tests.helpers.servers import TUNER_BIN, clean_env
from tuner.errors import StorageError
from tuner.storage import Store, get_engine, migrations, optuna_storage, upgrade
from tuner.storage.db import schema_revision
from tuner.storage.migrations import VERSION_TABLE, include_object
from tuner.storage.schema import metadata

DATA = Path(__file__).parent / "data"
PRE_ALEMBIC_DB = DATA / "pre_alembic_fb0cbe4.db"  # written by tuner at fb0cbe4 (data/make_pre_alembic_db.py)
OURS = {"tuner_meta", "tuner_studies", "tuner_search_runs", "tuner_probes", "tuner_claims"}

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _old_schema() -> ModuleType:
    spec = importlib.util.spec_from_file_location("schema_fb0cbe4", DATA / "schema_fb0cbe4.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _make_pre_alembic(url: str) -> None:
    """What tuner at fb0cbe4 did on first use: metadata.create_all, then the tuner_meta schema_version=1 row."""
    old = _old_schema()
    engine = sa.create_engine(url)
    old.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(old.meta).values(key="schema_version", value="1"))
    engine.dispose()


def _tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TUNER_BIN, *args], capture_output=True, text=True, env=clean_env(), timeout=120)


def _shape(url: str) -> dict:
    """Every table, column, key, index and constraint of our tables, as the database reports them."""
    engine = sa.create_engine(url)
    insp = sa.inspect(engine)
    shape = {}
    for table in sorted(OURS):
        shape[table] = {
            "columns": [(c["name"], str(c["type"]), c["nullable"], c.get("default")) for c in insp.get_columns(table)],
            "pk": insp.get_pk_constraint(table),
            "fks": insp.get_foreign_keys(table),
            "indexes": sorted(insp.get_indexes(table), key=lambda i: str(i["name"])),
            "unique": sorted(insp.get_unique_constraints(table), key=lambda u: str(u["name"])),
        }
    engine.dispose()
    return shape


def _meta_version(url: str) -> str:
    with get_engine(url).connect() as conn:
        return conn.execute(sa.text("SELECT value FROM tuner_meta WHERE key = 'schema_version'")).scalar_one()


def test_head_is_the_latest_script_and_one_line_of_history() -> None:
    assert migrations.script().get_current_head() == migrations.HEAD
    assert [r.revision for r in migrations.script().walk_revisions()] == [
        "0005",
        "0004",
        "0003",
        "0002",
        "0001",
    ]  # no branches


def test_head_matches_the_code_metadata(storage_url: str) -> None:
    upgrade(storage_url)
    with get_engine(storage_url).connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"include_object": include_object, "compare_type": True, "version_table": VERSION_TABLE}
        )
        assert compare_metadata(ctx, metadata) == []


def test_migrations_make_exactly_the_pre_alembic_tables(storage_url: str, new_postgres_url, tmp_path: Path) -> None:
    old_url = f"sqlite:///{tmp_path / 'old.db'}" if storage_url.startswith("sqlite") else new_postgres_url()
    _make_pre_alembic(old_url)
    engine = sa.create_engine(storage_url)
    with engine.begin() as conn:  # up to 0002, the last revision of the pre-alembic tables (0003 adds record_uid)
        command.upgrade(migrations.config(conn), "0002")
    engine.dispose()
    assert _shape(storage_url) == _shape(old_url)
    if storage_url.startswith("sqlite"):  # the DDL text itself, too
        ddl = (
            f"SELECT type, name, sql FROM sqlite_master WHERE tbl_name IN ({', '.join('?' * len(OURS))}) ORDER BY name"
        )
        fresh = sqlite3.connect(storage_url.removeprefix("sqlite:///")).execute(ddl, sorted(OURS)).fetchall()
        made_before = sqlite3.connect(old_url.removeprefix("sqlite:///")).execute(ddl, sorted(OURS)).fetchall()
        assert fresh == made_before and len(fresh) == 5 + 3 + 3  # tables, indexes, sqlite's autoindexes (PK/unique)


@pytest.mark.parametrize("optuna_first", [True, False], ids=["optuna-first", "tuner-first"])
def test_optuna_and_tuner_version_tables_coexist(storage_url: str, optuna_first: bool) -> None:
    if optuna_first:
        optuna.create_study(study_name="s", storage=optuna_storage(storage_url, None, None))
        Store(storage_url).ensure_study("s", {"model": "m"})
    else:
        Store(storage_url).ensure_study("s", {"model": "m"})
        optuna.create_study(study_name="s", storage=optuna_storage(storage_url, None, None))
    ostorage = optuna.storages.RDBStorage(storage_url)
    assert ostorage.get_current_version() == ostorage.get_head_version()
    ostorage.upgrade()  # Optuna's own alembic upgrade runs beside our tables and leaves them alone
    with get_engine(storage_url).connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == (
            ostorage.get_head_version()
        )
        assert conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one() == migrations.head()
    assert schema_revision(get_engine(storage_url)) == migrations.head()
    assert Store(storage_url).study_definition("s") == {"model": "m"}
    assert optuna.load_study(study_name="s", storage=storage_url).study_name == "s"
    ostorage.engine.dispose()


def _rows(path: Path) -> dict[str, list[tuple]]:
    con = sqlite3.connect(path)
    tables = sorted(
        r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")
    )
    rows = {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}
    con.close()
    return rows


def test_a_pre_alembic_sqlite_file_upgrades_in_place_through_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    shutil.copy(PRE_ALEMBIC_DB, path)
    url = f"sqlite:///{path}"
    before = _rows(path)
    assert before["tuner_meta"] == [("schema_version", "1")] and VERSION_TABLE not in before

    out = _tuner("db", "upgrade", "--storage", url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"tuner schema at revision {migrations.head()} (was: no tuner revision)"
    after = _rows(path)
    assert after.pop(VERSION_TABLE) == [(migrations.head(),)]
    assert after.pop("tuner_meta") == [("schema_version", "2")]  # pre-alembic tuners now refuse it in one line
    before.pop("tuner_meta")
    assert all(row[-1] is None for row in after["tuner_probes"])  # 0003's record_uid: NULL on the rows from before
    after["tuner_probes"] = [row[:-1] for row in after["tuner_probes"]]
    for table in ("tuner_nodes", "tuner_node_leases", "tuner_node_probes", "tuner_node_parts"):  # 0005's, empty
        assert after.pop(table) == []
    assert after == before  # every row of every table (ours and Optuna's) kept as it was

    store = Store(url)
    probes = store.probes("old-demo")
    assert len(probes) == 8 and {p.status for p in probes} >= {"ok", "oom", "inferred-oom", "error"}
    assert probes[0].knobs["micro_batch_size"] == 1 and (probes[0].result or {})["capacity"] == 160 << 20
    assert store.count_probes("old-demo")["ok"] == 5
    assert store.require_study("old-demo")["world_size"] == 2
    assert [r.status for r in store.runs("old-demo")] == ["finished"]
    assert store.claim_owner("old-demo", "k" * 32, "short") == "host-a:123"
    new_id = store.record_probe(probes[0])  # its id and timestamp are the storage's: a new row
    assert new_id == max(p.id or 0 for p in probes) + 1

    study = optuna.load_study(study_name="old-demo", storage=url)
    assert len(study.trials) == 8 and study.best_trial.number == 3
    best = _tuner("best", "--study", "old-demo", "--storage", url)
    assert best.returncode == 0 and json.loads(best.stdout)["knobs"]["micro_batch_size"] == 4, best.stderr

    again = _tuner("db", "upgrade", "--storage", url)
    assert again.returncode == 0 and "already at revision" in again.stdout


@pytest.mark.postgres
def test_a_pre_alembic_postgres_database_upgrades_in_place_through_the_cli(new_postgres_url) -> None:
    url = new_postgres_url()
    _make_pre_alembic(url)
    old = _old_schema()
    engine = sa.create_engine(url)
    now = dt.datetime.now(dt.timezone.utc)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(old.studies).values(name="pg-old", created_at=now, definition={"m": 1}, created_by="cli")
        )
        run = conn.execute(
            sa.insert(old.search_runs).values(study_name="pg-old", worker="h:1", started_at=now, status="finished")
        ).inserted_primary_key[0]
        for i in range(3):
            conn.execute(
                sa.insert(old.probes).values(
                    study_name="pg-old",
                    trial_number=i,
                    run_id=run,
                    fidelity="short",
                    config_key=f"k{i}",
                    knobs={"micro_batch_size": 2**i},
                    config={},
                    status="ok",
                    stable=True,
                    result={},
                    peak_allocated=1,
                    created_at=now,
                )
            )
        conn.execute(
            sa.insert(old.claims).values(
                study_name="pg-old", config_key="k0", fidelity="short", worker="h:1", claimed_at=now
            )
        )
    engine.dispose()
    optuna.create_study(study_name="pg-old", storage=optuna_storage(url, None, None)).enqueue_trial({"x": 1})

    out = _tuner("db", "upgrade", "--storage", url)
    assert out.returncode == 0, out.stderr
    store = Store(url)
    assert [p.knobs["micro_batch_size"] for p in store.probes("pg-old")] == [1, 2, 4]
    assert store.claim_owner("pg-old", "k0", "short") == "h:1"
    assert store.require_study("pg-old") == {"m": 1}
    assert not store.claim("pg-old", "k0", "short", None, "h:2")  # the unique constraint still holds
    assert _meta_version(url) == "2" and schema_revision(get_engine(url)) == migrations.head()
    assert len(optuna.load_study(study_name="pg-old", storage=url).trials) == 1


def test_0003_adds_the_record_uid_and_keeps_the_rows(storage_url: str) -> None:
    engine = sa.create_engine(storage_url)
    with engine.begin() as conn:
        command.upgrade(migrations.config(conn), "0002")
    engine.dispose()
    store_rows = _old_schema()
    with sa.create_engine(storage_url).begin() as conn:
        conn.execute(
            sa.insert(store_rows.probes).values(
                study_name="s",
                fidelity="short",
                config_key="k",
                knobs={},
                config={},
                status="ok",
                stable=True,
                result={},
                peak_allocated=1,
                created_at=dt.datetime.now(dt.timezone.utc),
            )
        )
    upgrade(storage_url)
    store = Store(storage_url)
    assert [p.config_key for p in store.probes("s")] == ["k"]
    row = store.probes("s")[0]
    first = store.record_probe(row, "uid-1")
    assert store.record_probe(row, "uid-1") == first  # idempotent on the journal key
    assert store.probe_id("uid-1") == first and len(store.probes("s")) == 2


def test_0004_indexes_the_probe_rows_by_trial(storage_url: str) -> None:
    engine = sa.create_engine(storage_url)
    with engine.begin() as conn:
        command.upgrade(migrations.config(conn), "0003")
        before = {ix["name"] for ix in sa.inspect(conn).get_indexes("tuner_probes")}
    engine.dispose()
    upgrade(storage_url)
    with get_engine(storage_url).connect() as conn:
        after = {ix["name"]: ix["column_names"] for ix in sa.inspect(conn).get_indexes("tuner_probes")}
    assert "ix_tuner_probes_study_trial" not in before
    assert after["ix_tuner_probes_study_trial"] == ["study_name", "trial_number"]


def test_a_newer_schema_is_refused_in_one_line(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    with get_engine(sqlite_url).begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    get_engine.cache_clear()
    with pytest.raises(StorageError, match=r"revision 9999, newer than this tuner.*upgrade tuner"):
        Store(sqlite_url)
    with pytest.raises(StorageError, match="newer than this tuner"):
        upgrade(sqlite_url)
    for args in (["db", "upgrade"], ["studies"], ["best", "--study", "x"]):
        out = _tuner(*args, "--storage", sqlite_url)
        assert out.returncode == 2, (args, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "newer than this tuner" in lines[0] and "upgrade tuner" in lines[0], out.stderr
    from fastapi.testclient import TestClient

    from api.app import create_app
    from tuner.settings import Settings

    r = TestClient(create_app(Settings(storage=sqlite_url))).get("/studies")
    assert r.status_code == 503 and "newer than this tuner" in r.json()["detail"]


def test_tuner_tables_of_unknown_origin_are_refused_in_one_line(sqlite_url: str) -> None:
    _make_pre_alembic(sqlite_url)
    with get_engine(sqlite_url).begin() as conn:
        conn.execute(sa.text("UPDATE tuner_meta SET value = '7'"))
    with pytest.raises(StorageError, match=r"without a tuner_alembic_version table \(schema_version 7\)"):
        Store(sqlite_url)


def test_downgrade_to_base_drops_only_our_tables(sqlite_url: str) -> None:
    optuna.create_study(study_name="s", storage=optuna_storage(sqlite_url, None, None))
    upgrade(sqlite_url)
    with get_engine(sqlite_url).begin() as conn:
        command.downgrade(migrations.config(conn), "base")
    names = set(sa.inspect(get_engine(sqlite_url)).get_table_names())
    assert not names & OURS and {"studies", "trials", "alembic_version"} <= names
    upgrade(sqlite_url)
    assert set(sa.inspect(get_engine(sqlite_url)).get_table_names()) >= OURS
    assert optuna.load_study(study_name="s", storage=sqlite_url).study_name == "s"


def test_first_use_at_head_does_not_load_alembic(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    code = f"import sys; from tuner.storage import Store; Store({sqlite_url!r}); print('alembic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
