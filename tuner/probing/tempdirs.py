"""The probe's temporary folders (the fork server's socket folder, a probe's work folder), named with the owning
process id so that the next run can sweep what a killed one (kill -9: no ``finally`` ran) left behind: only folders of
this user, not links, whose owner process is gone."""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from functools import cache
from pathlib import Path

PREFIXES = ("tuner-fs-", "tuner-probe-", "tuner-node-")
_OWNED = re.compile(r"^(?:tuner-fs-|tuner-probe-|tuner-node-)(\d+)-")


def owned_dir(prefix: str) -> Path:
    """A new private temporary folder named ``<prefix><pid>-<random>``."""
    assert prefix in PREFIXES, prefix
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def sweep(root: Path | None = None) -> list[Path]:
    """Removes the leftover folders under ``root`` (the temp dir) whose owning process is dead and that belong to this
    user; returns them. Anything else (a live owner, another user's folder, a link, an unreadable entry) is left."""
    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        found = _OWNED.match(entry.name)
        if found is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        pid = int(found.group(1))
        if pid == os.getpid() or _alive(pid):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


@cache
def sweep_once() -> list[Path]:
    """sweep() of the temp dir, once per process (the first probe runner of a run)."""
    return sweep()
