"""Writing a user's output file (`-o`) whole or not at all: a temporary file in the same folder, fsync'd, then renamed
over the old one. A full disk (or any failed write) leaves the old file as it was and no temporary file behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str, encoding: str = "utf-8") -> None:
    """Replaces ``path`` with ``text`` in one rename; raises OSError with the old file untouched."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding=encoding) as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _mode(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode(path: Path) -> int:
    """The old file's permissions, else what a plain open() would give (0666 less the umask)."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


__all__ = ["write_atomic"]
