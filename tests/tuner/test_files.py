"""Issue 24 §6: `tuner report -o` / `tuner best -o` onto a disk that takes no more bytes left the old file truncated.
A real write limit (RLIMIT_FSIZE in the child process: its writes past the limit fail with EFBIG, as on a full disk)
on the real CLI: one line, exit 2, the old file as it was, no temporary file."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.report_study import populate_study
from tuner.files import write_atomic

LIMIT = 64 * 1024  # bytes any one file of the child may grow to: the report is larger, SQLite's files are smaller


def _limited() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_a_report_that_cannot_be_written_whole_leaves_the_old_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    populate_study(url, "rep")
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    out.write_text("the old report\n")
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "report", "--study", "rep", "--storage", url, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited,
        env={"COLUMNS": "300", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "cannot write the report" in done.stderr, done.stderr
    assert out.read_text() == "the old report\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.html"]  # no temporary file left


def test_write_atomic_replaces_whole_and_keeps_the_old_mode(tmp_path: Path) -> None:
    path = tmp_path / "best.json"
    path.write_text("old")
    path.chmod(0o640)
    write_atomic(path, "new")
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["best.json"]


def test_the_cache_and_gpu_lock_folders_are_this_users_alone(tmp_path: Path) -> None:
    """Issue 24 §6: both were made 0755 by the umask (the GPU-lock folder shared by every user, with 0666 lock
    files), with no owner check. The cache is 0700; the GPU-lock folder is shared on purpose (issue 23 §9), so it is
    sticky with 0644 files, and another user's folder that is not sticky is refused (test_gpu_host)."""
    from tuner.errors import ConfigError
    from tuner.files import private_dir
    from tuner.probing.environment import probe_env
    from tuner.probing.gpus import gpu_locks
    from tuner.settings import Settings

    cache = tmp_path / "cache"
    probe_env(1, base={}, settings=Settings(cache_dir=cache))
    assert cache.stat().st_mode & 0o777 == 0o700
    locks = tmp_path / "locks"
    with gpu_locks(["gpu0"], 5, lock_dir=locks) as held:
        assert held
    # shared by every user's workers (issue 23 §9) but sticky, and no lock file anyone but its maker can write
    assert locks.stat().st_mode & 0o7777 == 0o1777 and (locks / "gpu0").stat().st_mode & 0o777 == 0o644
    opened = tmp_path / "opened"
    opened.mkdir(mode=0o755)
    opened.chmod(0o755)
    assert private_dir(opened).stat().st_mode & 0o777 == 0o700  # ours and open to others: tightened
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    if os.getuid() == 0:  # only root can give a folder away; as another user the check is the same
        os.chown(theirs, 12345, 12345)
        with pytest.raises(ConfigError, match="belongs to another user"):
            private_dir(theirs)
