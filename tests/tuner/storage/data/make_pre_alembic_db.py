"""Regenerates pre_alembic_fb0cbe4.db: a storage written by tuner at commit fb0cbe4, the last schema made by
metadata.create_all with a tuner_meta schema_version=1 row and no tuner alembic table. Kept as a file, not remade in
the tests, so the upgrade test reads what that code really wrote. Run with that commit's code first on the path:

    mkdir -p /tmp/old && git archive fb0cbe4 tuner trials api tests/api/sample_storage.py | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old:/tmp/old/tests/api .venv/bin/python tests/tuner/storage/data/make_pre_alembic_db.py OUT.db

Contents: study "old-demo" (tests/api/sample_storage.populate: 8 probe rows, 1 search run, 7 finished Optuna trials
and one RUNNING) and one claim.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys


def write(path: str) -> None:
    from sample_storage import populate

    import tuner.storage.db as db
    from tuner.storage import Store

    assert not hasattr(db, "VERSION_TABLE"), f"{db.__file__} is not the pre-alembic code"
    url = f"sqlite:///{path}"
    populate(url, "old-demo")
    assert Store(url).claim("old-demo", "k" * 32, "short", 7, "host-a:123")


def main(path: str) -> None:
    if os.path.exists(path):
        os.remove(path)
    subprocess.run([sys.executable, __file__, "--write", path], check=True)
    con = sqlite3.connect(path)  # the writer has exited: fold the WAL into one self-contained, compact file
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("VACUUM")
    con.execute("PRAGMA journal_mode=WAL")  # as that code leaves a file (persistent; no -wal file once closed)
    con.close()
    assert not os.path.exists(path + "-wal")


if __name__ == "__main__":
    if sys.argv[1] == "--write":
        write(sys.argv[2])
    else:
        main(sys.argv[1])
