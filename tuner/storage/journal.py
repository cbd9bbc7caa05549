"""The local journal of finished probes not yet stored: a measurement is written here (JSON lines, fsync'd) the moment
its probe returns, before the database is asked to keep it, and dropped from here once the database has it.

A worker that dies (kill -9, the OOM killer) or gives up on a database that stays away leaves its journal behind; the
next `tuner search` of the study on this host replays it (Store.record_probe is idempotent on the entry's ``uid``), so
no finished measurement is lost at any instant.

Where (``journal_places``, in order of preference): beside a SQLite database file (``<db>.journal.d/``, which
SQLite's own ``-journal``/``-wal`` names never take), then under the cache directory, one folder per database (its URL
without the password, hashed); a server database has only the second. One file per worker
(``<study>-<hash>.<host>.<pid>.jsonl``): a worker rewrites only its own files.

A full or read-only filesystem takes the database and the journal beside it together: an entry the first place
refuses goes to the next, and one no place takes is held in memory and written again at each later ``add`` and
before the search stops (``Journal.kept``), which says where each unstored entry is, and never "kept" for one held
only in memory. A worker that stops on a storage error leaves a stop line in its journal (``note_stop``): the next
run names that cause for the trials it fails, not "killed".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterator, Sequence
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
    """The first folder holding the journals of one database (see the module doc)."""
    return journal_places(url, cache_dir)[0]


def journal_places(url: str, cache_dir: Path) -> list[Path]:
    """Every folder that may hold the journals of one database, in order of preference (see the module doc)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        db = Path(parsed.database).expanduser().resolve()
        key = f"sqlite:///{db}"
        return [
            db.with_name(db.name + ".journal.d"),
            cache_dir / "journal" / hashlib.sha256(key.encode()).hexdigest()[:16],
        ]
    safe = parsed.render_as_string(hide_password=True)
    return [cache_dir / "journal" / hashlib.sha256(safe.encode()).hexdigest()[:16]]


def safe_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:100]


def _study_part(study: str) -> str:
    """The study's part of a file name: readable, and unambiguous (its hash) whatever the name holds."""
    return f"{safe_part(study)[:60]}-{hashlib.sha256(study.encode()).hexdigest()[:8]}"


class Journal:
    """One worker's journal for one study: a file in the first of its places that takes the entry, else memory."""

    def __init__(self, folder: Path, study: str, worker: str, fallbacks: Sequence[Path] = ()) -> None:
        host, _, pid = worker.rpartition(":")
        name = f"{_study_part(study)}.{safe_part(host or socket.gethostname())}.{safe_part(pid)}{SUFFIX}"
        self.paths = [f / name for f in (folder, *fallbacks)]
        self.path = self.paths[0]
        self._held: dict[str, Entry] = {}  # every entry not stored yet, by uid
        self._where: dict[str, Path | None] = {}  # the file keeping each; None: memory only
        self.failures: dict[Path, str] = {}  # each place that refused a write, and why (the last time)

    def add(self, entry: Entry) -> Path | None:
        """Makes ``entry`` durable in the first place that takes it (with every entry still held only in memory);
        returns that file, or None when no place took it (it is held in memory and written again later)."""
        self._held[entry.uid] = entry
        self._where[entry.uid] = None
        self.retry()
        return self._where[entry.uid]

    def retry(self) -> None:
        """Writes the entries held only in memory to the first place that takes them."""
        waiting = [e for uid, e in self._held.items() if self._where[uid] is None]
        if not waiting:
            return
        for path in self.paths:
            try:
                _append(path, waiting)
            except OSError as err:
                self.failures[path] = err.strerror or type(err).__name__
                continue
            for e in waiting:
                self._where[e.uid] = path
            return

    def pending(self) -> list[Entry]:
        """The entries on disk in every place of this journal, and those held only in memory (each once)."""
        found = {e.uid: e for path in self.paths for e in read_entries(path)}
        found.update({uid: e for uid, e in self._held.items() if uid not in found})
        return list(found.values())

    def done(self, uid: str) -> None:
        """Drops ``uid`` (now stored); a file goes when nothing is left in it. A file that cannot be rewritten (a full
        disk) keeps it: a replay skips a uid already stored."""
        self._held.pop(uid, None)
        where = self._where.pop(uid, None)
        if where is None:
            return
        try:
            write_entries(where, [e for e in read_entries(where) if e.uid != uid])
        except OSError:
            pass

    def kept(self, tries: int = 3, pause_s: float = 1.0) -> str:
        """Where the entries not stored are, in words, after ``tries`` more writes of those held only in memory."""
        for attempt in range(tries):
            if attempt:
                time.sleep(pause_s)
            self.retry()
            if all(w is not None for w in self._where.values()):
                break
        if not self._held:
            return "every finished probe is stored"
        files = sorted({str(w) for w in self._where.values() if w is not None})
        lost = sum(w is None for w in self._where.values())
        parts = (
            [f"{len(self._held) - lost} finished probe(s) not stored are kept in {', '.join(files)}"] if files else []
        )
        if lost:
            why = "; ".join(f"{p.parent}: {reason}" for p, reason in self.failures.items())
            parts.append(f"{lost} finished probe(s) could not be written anywhere ({why}) and are lost")
        return ", ".join(parts)

    def note_stop(self, cause: str) -> None:
        """Leaves ``cause`` (why this worker stops) in the first place that takes it, for the next run to name."""
        for path in self.paths:
            try:
                _append(path, [], stop=cause)
                return
            except OSError:
                continue


def _append(path: Path, entries: list[Entry], stop: str | None = None) -> None:
    """Appends ``entries`` (and a stop line) durably; a failed write is cut back off, so no torn line is left for a
    later append to run into."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(e.line() for e in entries) + (json.dumps({"stopped": stop}) + "\n" if stop is not None else "")
    with path.open("a", encoding="utf-8") as fh:
        size = fh.tell()
        try:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                os.truncate(path, size)
            raise


def read_stop(path: Path) -> str | None:
    """The last stop line of one journal file (``Journal.note_stop``), or None."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError, AttributeError):
            data = json.loads(line)
            if isinstance(data, dict) and isinstance(data.get("stopped"), str):
                return str(data["stopped"])
    return None


def read_entries(path: Path) -> list[Entry]:
    """The entries of one journal file; a torn last line (killed mid-write, before its fsync returned) is skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
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
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.writelines(e.line() for e in entries)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)  # a full disk leaves no half-written temporary file behind
        raise


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


__all__ = [
    "Entry",
    "Journal",
    "journal_dir",
    "journal_places",
    "journals",
    "read_entries",
    "read_stop",
    "safe_part",
    "write_entries",
]
