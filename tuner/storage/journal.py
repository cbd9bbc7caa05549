"""The local journal of finished probes not yet stored: a measurement is written here (JSON lines, fsync'd) the moment
its probe returns, before the database is asked to keep it, and dropped from here once the database has it.

A worker that dies (kill -9, the OOM killer) or gives up on a database that stays away leaves its journal behind; the
next `tuner search` of the study on this host replays it (Store.record_probe is idempotent on the entry's ``uid``), so
no finished measurement is lost at any instant.

Where: beside a SQLite database file (``<db>.journal.d/``, which SQLite's own ``-journal``/``-wal`` names never take);
for a server database under the cache directory, one folder per database (its URL without the password, hashed).
One file per worker (``<study>-<hash>.<host>.<pid>.jsonl``): a worker rewrites only its own file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

SUFFIX = ".jsonl"


@dataclass(frozen=True)
class Entry:
    """One unrecorded probe row: its idempotency key and its columns (ProbeRow.to_record, JSON-safe)."""

    uid: str
    record: dict[str, Any]

    def line(self) -> str:
        return json.dumps({"uid": self.uid, "record": self.record}, sort_keys=True, allow_nan=True) + "\n"


def journal_dir(url: str, cache_dir: Path) -> Path:
    """The folder holding the journals of one database (see the module doc)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        db = Path(parsed.database).expanduser().resolve()
        return db.with_name(db.name + ".journal.d")
    safe = parsed.render_as_string(hide_password=True)
    return cache_dir / "journal" / hashlib.sha256(safe.encode()).hexdigest()[:16]


def safe_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:100]


def _study_part(study: str) -> str:
    """The study's part of a file name: readable, and unambiguous (its hash) whatever the name holds."""
    return f"{safe_part(study)[:60]}-{hashlib.sha256(study.encode()).hexdigest()[:8]}"


class Journal:
    """One worker's journal file for one study."""

    def __init__(self, folder: Path, study: str, worker: str) -> None:
        host, _, pid = worker.rpartition(":")
        self.path = folder / f"{_study_part(study)}.{safe_part(host or socket.gethostname())}.{safe_part(pid)}{SUFFIX}"

    def add(self, entry: Entry) -> None:
        """Appends ``entry`` and makes it durable before returning."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(entry.line())
            fh.flush()
            os.fsync(fh.fileno())

    def pending(self) -> list[Entry]:
        return read_entries(self.path)

    def done(self, uid: str) -> None:
        """Drops ``uid`` (now stored); the file goes when nothing is left in it."""
        rest = [e for e in self.pending() if e.uid != uid]
        write_entries(self.path, rest)


def read_entries(path: Path) -> list[Entry]:
    """The entries of one journal file; a torn last line (killed mid-write, before its fsync returned) is skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            data = json.loads(line)
            out.append(Entry(uid=str(data["uid"]), record=dict(data["record"])))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def write_entries(path: Path, entries: list[Entry]) -> None:
    """Replaces the file atomically with ``entries`` (removes it when there are none)."""
    if not entries:
        path.unlink(missing_ok=True)
        return
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.writelines(e.line() for e in entries)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def journals(folder: Path, study: str) -> Iterator[tuple[Path, str, int | None]]:
    """Every journal file of ``study`` in ``folder``: (path, host, pid)."""
    if not folder.is_dir():
        return
    prefix = _study_part(study) + "."
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        name = path.name[: -len(SUFFIX)]
        if not name.startswith(prefix):
            continue
        host, _, pid = name[len(prefix) :].rpartition(".")
        if host:
            yield path, host, int(pid) if pid.isdigit() else None


__all__ = ["Entry", "Journal", "journal_dir", "journals", "read_entries", "safe_part", "write_entries"]
