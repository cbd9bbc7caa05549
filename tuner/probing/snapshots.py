"""Where a probe's CUDA memory snapshots are kept (trials.oom_snapshot writes one beside a rank's result when an OOM
stops it): moved out of the probe's temporary work folder before it is removed, into a folder beside the study's
SQLite file (else the cache folder), and the stored result's path rewritten to it; at most ``MAX_KEPT`` are kept
(the oldest go first), so the folder stays bounded. The paths are pure functions; ``keep`` moves the files."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from trials.contract import ProbeResult
from tuner.settings import sqlite_file

MAX_KEPT = 20  # snapshots kept per folder (each at most trials.oom_snapshot.MAX_SNAPSHOT_BYTES)
SUFFIX = ".snapshot.pickle"


def snapshot_dir(storage: str, cache_dir: Path) -> Path:
    """Beside a SQLite storage file (``tuner.db`` -> ``tuner.db.oom-snapshots``), else under the cache folder."""
    db = sqlite_file(storage)
    if db is None or db.name == ":memory:":
        return cache_dir / "oom-snapshots"
    return db.with_name(db.name + ".oom-snapshots")


def kept_name(stamp: float, rank: int, taken: Sequence[str]) -> str:
    """A new snapshot's file name: its time, its rank, unique among ``taken``."""
    base = time.strftime("%Y%m%dT%H%M%S", time.gmtime(stamp)) + f"-rank{rank}"
    name, n = base + SUFFIX, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}{SUFFIX}"
    return name


def evicted(files: Sequence[tuple[str, float]], limit: int = MAX_KEPT) -> list[str]:
    """Of ``(name, mtime)`` snapshots, those to delete so that ``limit`` remain: the oldest."""
    ordered = sorted(files, key=lambda f: (f[1], f[0]))
    return [name for name, _ in ordered[: max(0, len(ordered) - limit)]]


def keep(result: ProbeResult, into: Path, limit: int = MAX_KEPT) -> ProbeResult:
    """``result`` with each rank's snapshot moved into ``into`` (the path rewritten; None where the file is gone or
    cannot be moved: no path to a file that is not there)."""
    if not any(r.snapshot for r in result.ranks):
        return result
    ranks = []
    for r in result.ranks:
        path = None
        if r.snapshot and Path(r.snapshot).is_file():
            try:
                into.mkdir(parents=True, exist_ok=True)
                taken = [p.name for p in into.iterdir()]
                target = into / kept_name(time.time(), r.rank, taken)
                shutil.move(r.snapshot, target)
                path = str(target.resolve())
            except OSError:
                path = None
        ranks.append(r.model_copy(update={"snapshot": path}))
    if into.is_dir():
        for name in evicted([(p.name, p.stat().st_mtime) for p in into.glob(f"*{SUFFIX}")], limit):
            (into / name).unlink(missing_ok=True)
    return result.model_copy(update={"ranks": ranks})
