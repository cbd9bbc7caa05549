"""Files tuner writes for a user: an output file (`-o`) whole or not at all (a temporary file in the same folder,
fsync'd, then renamed over the old one: a full disk leaves the old file as it was and no temporary file behind), and
folders only this user may enter (the cache dir, the GPU locks)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tuner.errors import ConfigError


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


def private_dir(path: Path) -> Path:
    """``path`` as a folder of this user's, mode 0700: made so, or tightened when it is ours and open to others; one
    line when another user owns it (their files would be ours to trust: op builds, journals, locks)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise ConfigError(
            f"{path} belongs to another user (uid {info.st_uid}); remove it, or point TUNER_CACHE_DIR / TMPDIR at a "
            "folder of yours"
        )
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return path


__all__ = ["private_dir", "write_atomic"]
