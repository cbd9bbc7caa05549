"""A search on a small filesystem that fills up or turns read-only mid-search, then resumed: run by
tests/tuner/session/test_full_filesystem.py as ``unshare -rm python -m tests.helpers.small_filesystem MODE ROOT``.

``unshare -rm`` gives this process a private mount namespace in which it may mount (no root on the host needed, and
the mount goes with the process). It mounts a 4 MiB tmpfs at ROOT/fs, runs a replayed search (a recorded table's
probes, as the benchmarks replay them) on SQLite there, with the cache directory (the journal's second place) at
ROOT/cache on the host's disk. After the second probe returns, before its row is kept, the filesystem is filled to the
last byte (MODE "full") or turned read-only ("ro", see ``fault``). Each search runs in a process of its own (the
stopped worker is a gone one when the next starts, as after any stop): the stopped one, then, with the filesystem
freed, the resume. Prints one JSON line: what the stop said, each run's probes, and what the database holds.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

from benchmarks.table import Env, Table
from trials.contract import ProbeConfig, ProbeResult
from tuner.errors import TunerError
from tuner.session.options import SearchOptions
from tuner.session.session import SearchSession
from tuner.settings import load_settings

TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "tables" / "tiny-1rank.json"
FAULT_AFTER = 2  # probes


def fill(fs: Path) -> None:
    """Writes to ``fs`` until it refuses a byte (ENOSPC)."""
    with (fs / "filler").open("wb", buffering=0) as fh:
        chunk = b"\0" * 65536
        try:
            while True:
                fh.write(chunk)
        except OSError:
            pass
        try:
            while True:
                fh.write(b"\0")
        except OSError:
            pass


def fault(mode: str, fs: Path) -> None:
    if mode == "full":
        fill(fs)
        return
    # Linux refuses a read-only remount while a file is open for writing (SQLite's is), unless the kernel forces it
    # after an I/O error as ext4's errors=remount-ro does: the journal's folder turns read-only for real (a read-only
    # bind mount: EROFS), and the database refuses its writes with SQLite's own read-only message
    journal = fs / "tuner.db.journal.d"
    journal.mkdir(exist_ok=True)
    subprocess.run(["mount", "--bind", str(journal), str(journal)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(journal)], check=True)
    with sqlite3.connect(fs / "tuner.db", timeout=60) as conn:
        for table in ("tuner_probes", "tuner_claims", "tuner_search_runs", "trials", "trial_values"):
            for op in ("INSERT", "UPDATE"):
                conn.execute(
                    f"CREATE TRIGGER ro_{op}_{table} BEFORE {op} ON {table} "
                    "BEGIN SELECT RAISE(ABORT, 'attempt to write a readonly database (injected)'); END"
                )


def undo(mode: str, fs: Path) -> None:
    if mode == "full":
        (fs / "filler").unlink()
        return
    subprocess.run(["umount", str(fs / "tuner.db.journal.d")], check=True)
    with sqlite3.connect(fs / "tuner.db", timeout=60) as conn:
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {name}")


def search(root: Path, mode: str | None) -> dict[str, object]:
    """One search run; with ``mode``, the fault strikes after FAULT_AFTER probes."""
    table = Table.load(TABLE)
    env = Env(table=table, seed=0, budget_s=1e9)
    fs = root / "fs"
    done: list[str] = []

    def probe(config: ProbeConfig) -> ProbeResult:
        result = env.probe(config.knobs)
        done.append(str(config.knobs))
        if mode is not None and len(done) == FAULT_AFTER:
            fault(mode, fs)
        return result

    url = f"sqlite:///{fs / 'tuner.db'}"
    options = SearchOptions(
        budget=3600,
        storage=url,
        study="small-fs",
        space=dict(table.raw["space"]),
        global_batch=table.global_batch,
        device_memory=table.device_memory,
        n_trials=4 if mode is not None else 5,
        finalists=0,
        seed=0,
    )
    settings = load_settings(storage=url, cache_dir=root / "cache")
    try:
        SearchSession(options, probe=probe, settings=settings).run()
        stopped = None
    except TunerError as err:
        stopped = str(err)
    return {"stopped": stopped, "probes": len(done)}


def child(*args: str) -> object:
    """Runs this module in a fresh process (in this mount namespace) and returns the JSON it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.small_filesystem", *args], check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout)


def main(mode: str, root: Path) -> None:
    fs = root / "fs"
    fs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(fs)], check=True)
    first = child("search", mode, str(root))
    undo(mode, fs)
    resumed = child("search", "none", str(root))
    print(json.dumps({"first": first, "resumed": resumed, "db": child("read", "none", str(root))}))


def read(root: Path) -> dict[str, object]:
    """What the database holds after the resume: the measured rows per run, the runs, and the failed trials' causes."""
    with sqlite3.connect(root / "fs" / "tuner.db") as conn:
        runs = conn.execute("SELECT id, status, message FROM tuner_search_runs ORDER BY id").fetchall()
        rows = conn.execute("SELECT run_id, trial_number, status FROM tuner_probes ORDER BY id").fetchall()
        causes = conn.execute(
            "SELECT t.number, ua.value_json FROM trials t JOIN trial_user_attributes ua ON ua.trial_id = t.trial_id "
            "WHERE t.state = 'FAIL' AND ua.key = 'cause'"
        ).fetchall()
    journals = sorted(str(p) for p in root.rglob("*.jsonl") if p.stat().st_size)
    return {"runs": runs, "rows": rows, "causes": causes, "journals": journals}


if __name__ == "__main__":
    if sys.argv[1] == "search":
        print(json.dumps(search(Path(sys.argv[3]), None if sys.argv[2] == "none" else sys.argv[2])))
    elif sys.argv[1] == "read":
        print(json.dumps(read(Path(sys.argv[3]))))
    else:
        main(sys.argv[1], Path(sys.argv[2]))
