"""The README's test command on a machine where no PostgreSQL answers: scripts/test.sh brings its own throwaway
cluster (scripts/throwaway-pg.sh), runs the PostgreSQL tests on it, and stops and removes it at the end."""

from __future__ import annotations

import glob
import os
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.helpers.servers import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_throwaway_cluster_starts_answers_and_is_removed() -> None:
    start = subprocess.run([ROOT / "scripts/throwaway-pg.sh", "start"], capture_output=True, text=True, timeout=120)
    assert start.returncode == 0, start.stderr
    exports = dict(item.split("=", 1) for item in start.stdout.split()[1:])
    admin, where = exports["TUNER_TEST_PG_ADMIN"], exports["TUNER_THROWAWAY_PG"]
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute('CREATE DATABASE "tuner_throwaway_check"')
            assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    finally:
        stop = subprocess.run([ROOT / "scripts/throwaway-pg.sh", "stop", where], capture_output=True, text=True)
    assert stop.returncode == 0, stop.stderr
    assert not Path(where).exists()
    try:
        psycopg.connect(admin, connect_timeout=2).close()
        raise AssertionError("the throwaway server still answers after stop")
    except psycopg.OperationalError:
        pass


def test_the_test_command_without_a_server_brings_its_own() -> None:
    """scripts/test.sh with TUNER_TEST_PG_ADMIN at a port where nothing listens: a PostgreSQL test passes on the
    throwaway cluster, and nothing of it is left behind."""
    tmp = tempfile.mkdtemp(prefix="tuner-testcmd-")
    os.chmod(tmp, 0o755)  # like /tmp: the server's own user (postgres, when run as root) reaches its directory
    env = {
        **os.environ,
        "TUNER_TEST_PG_ADMIN": f"postgresql://postgres@127.0.0.1:{free_port()}/postgres",
        "TMPDIR": tmp,
        "TUNER_TEST_INSTALL": "0",  # this suite's venv is installed: a reinstall from here would remap its tuner
    }
    env.pop("TUNER_TEST_POSTGRES", None)
    test = (
        "tests/tuner/storage/test_storage_first_use.py::test_concurrent_first_use_of_one_postgres_database_all_succeed"
    )
    done = subprocess.run(
        [ROOT / "scripts/test.sh", test], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "starting a throwaway cluster" in done.stderr and "1 passed" in done.stdout
    assert not glob.glob(f"{tmp}/tuner-pg.*")  # stopped and removed
