"""What the GPU check leaves under $OUT (stdlib only), written as soon as each piece exists, so a hard kill of the
check still brings back what was done: eight files at most, each under the transfer limit (the device tool returns at
most 8 files of 16 MiB, 64 MiB together: /work/.library/device/README.md).

Every write is whole or absent (a temporary file renamed into place): a kill never leaves half a database. The study
database is copied with SQLite's online backup (a consistent copy, also of a database a killed search left with a
hot journal); each CUDA snapshot is gzipped and kept only under its cap; each text file is cut to its cap, its
head and its tail kept."""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import sqlite3
from pathlib import Path

MiB = 1 << 20
VERDICTS = "verdicts.txt"  # the plan, one line per step, the pinned variants, the rerun commands, the verdict
PROBES = "probes.txt"  # the probe table, the OOM records, the crash and Trainer lines, the explains
ENV = "env.txt"  # GPU, driver, compilers, arch list, allocator settings, library versions
OPS = "ops.log"  # each op's build, verbose
DB = "gpu-check.db"  # the study database: the search, the crash study
OOM_SNAPSHOT = "oom-snapshot.pickle.gz"  # the search's first OOM's CUDA memory snapshot
CRASH_SNAPSHOT = "crash-snapshot.pickle.gz"  # the crash study's
LOG = "gpu_check.log"  # everything else: each command's own output
FILES = (VERDICTS, PROBES, ENV, OPS, DB, OOM_SNAPSHOT, CRASH_SNAPSHOT, LOG)
MAX_FILES = 8  # what the device tool returns at most
FILE_CAP = 15 * MiB  # under the tool's 16 MiB per file
SNAPSHOT_CAP = 12 * MiB  # a gzipped snapshot; two of them, the log and the rest stay under the tool's 64 MiB
LOG_CAP = 8 * MiB
TEXT_CAP = 2 * MiB
TOTAL_CAP = 64 * MiB

assert len(FILES) <= MAX_FILES  # by construction: a ninth file would not come back


def capped(text: str, limit: int) -> str:
    """``text`` within ``limit`` bytes (UTF-8): its head and tail, and how much was cut between them."""
    data = text.encode()
    if len(data) <= limit:
        return text
    keep = max(0, limit - 200) // 2
    cut = len(data) - 2 * keep
    said = f"\n... [{cut:,} bytes cut here: the file's cap is {limit:,}] ...\n"
    return data[:keep].decode(errors="ignore") + said + data[-keep:].decode(errors="ignore")


def backup(src: Path, dst: Path) -> None:
    """A consistent copy of the SQLite database ``src`` at ``dst`` (SQLite's online backup), opened read-write: a hot
    journal a killed search left is rolled back first (its writer is gone). sqlite3.Error when it cannot be read."""
    dst.unlink(missing_ok=True)
    with (
        contextlib.closing(sqlite3.connect(src, timeout=10)) as source,
        contextlib.closing(sqlite3.connect(dst)) as target,
    ):
        source.backup(target)


class Evidence:
    """$OUT: the check's files, each put in place whole."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        if name not in FILES:
            raise ValueError(f"{name} is not one of the check's {len(FILES)} files")
        return self.out / name

    def _replace(self, tmp: Path, name: str) -> None:
        os.replace(tmp, self.path(name))

    def write(self, name: str, text: str, cap: int = TEXT_CAP) -> None:
        tmp = self.out / f".{name}.tmp"
        tmp.write_text(capped(text, cap))
        self._replace(tmp, name)

    def database(self, src: Path) -> str:
        """The study database copied (SQLite's backup: consistent); one line saying what came of it."""
        if not src.is_file():
            return "no database yet"
        tmp = self.out / f".{DB}.tmp"
        try:
            backup(src, tmp)
        except sqlite3.Error as exc:  # a database a kill left unreadable: its bytes, as they are
            shutil.copyfile(src, tmp)
            said = f"copied as it is (SQLite could not back it up: {exc})"
        else:
            said = "copied"
        size = tmp.stat().st_size
        if size > FILE_CAP:
            tmp.unlink()
            return f"not copied: {size / MiB:,.1f} MiB, over the {FILE_CAP // MiB} MiB a file may take back"
        self._replace(tmp, DB)
        return f"{said} ({size / MiB:,.2f} MiB)"

    def snapshot(self, src: str | None, name: str, cap: int = SNAPSHOT_CAP) -> str:
        """A CUDA memory snapshot gzipped under its cap; one line saying what came of it."""
        if not src:
            return "none made"
        path = Path(src)
        if not path.is_file():
            return f"{src} is gone"
        tmp = self.out / f".{name}.tmp"
        with open(path, "rb") as raw, gzip.open(tmp, "wb", compresslevel=6) as packed:
            shutil.copyfileobj(raw, packed, 4 * MiB)
        size = tmp.stat().st_size
        if size > cap:
            tmp.unlink()
            return f"not copied: {size / MiB:,.1f} MiB gzipped, over its {cap // MiB} MiB cap (kept at {src})"
        self._replace(tmp, name)
        return f"{name} ({path.stat().st_size / MiB:,.1f} MiB, {size / MiB:,.1f} MiB gzipped)"

    def log(self, src: Path) -> None:
        """The whole log, its head and tail kept under LOG_CAP."""
        try:
            text = src.read_text(errors="replace")
        except OSError:
            return
        self.write(LOG, text, LOG_CAP)

    def check(self) -> list[str]:
        """What is wrong with $OUT for the trip back (files not the check's, over a cap); empty when nothing."""
        problems = []
        names = [p.name for p in self.out.iterdir() if not p.name.startswith(".")]
        extra = sorted(set(names) - set(FILES))
        if extra or len(names) > MAX_FILES:
            problems.append(f"$OUT holds {len(names)} files ({', '.join(extra) or 'none extra'} not the check's)")
        sizes = {p.name: p.stat().st_size for p in self.out.iterdir() if p.is_file()}
        problems += [f"{n} is {s / MiB:,.1f} MiB" for n, s in sizes.items() if s > FILE_CAP]
        if sum(sizes.values()) > TOTAL_CAP:
            problems.append(f"$OUT holds {sum(sizes.values()) / MiB:,.1f} MiB")
        return problems

    def tidy(self) -> None:
        """Removes temporary files a kill left (a dot file still comes back as a file)."""
        for p in self.out.iterdir():
            if p.name.startswith(".") and p.is_file():
                p.unlink(missing_ok=True)


__all__ = ["FILES", "MAX_FILES", "Evidence", "backup", "capped"]
