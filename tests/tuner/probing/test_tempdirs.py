"""Temporary folders a killed run (kill -9) left behind are swept by the next run: only this user's folders whose
owning process is gone (issue 24 §6). Real processes, real folders."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tuner.probing import tempdirs
from tuner.probing.runner import ProbeRunner
from tuner.settings import Settings


def _dead_pid() -> int:
    """The pid of a process killed with SIGKILL (and reaped): what a `kill -9`ed search leaves as owner."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return proc.pid


def test_sweep_removes_only_a_dead_owners_folders(tmp_path: Path) -> None:
    dead = _dead_pid()
    left = [tmp_path / f"tuner-fs-{dead}-abc", tmp_path / f"tuner-probe-{dead}-def"]
    for d in left:
        (d / "ranks").mkdir(parents=True)
        (d / "ranks" / "result.json").write_text("{}")
    live = tmp_path / f"tuner-probe-{os.getppid()}-ghi"  # the owner (pytest's parent) still runs
    mine = tmp_path / f"tuner-probe-{os.getpid()}-jkl"  # this process's own
    other = tmp_path / f"other-{dead}-x"  # not ours by name
    target = tmp_path / "target"
    for d in (live, mine, other, target):
        d.mkdir()
    link = tmp_path / f"tuner-probe-{dead}-link"
    link.symlink_to(target)  # a link is never followed nor removed
    removed = tempdirs.sweep(tmp_path)
    assert sorted(removed) == sorted(left)
    assert not any(d.exists() for d in left)
    assert all(d.is_dir() for d in (live, mine, other, target)) and link.is_symlink()


def test_a_probe_runner_sweeps_what_a_killed_run_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    tempdirs.sweep_once.cache_clear()
    fs, probe = tempdirs.owned_dir("tuner-fs-"), tempdirs.owned_dir("tuner-probe-")
    assert fs.name.startswith(f"tuner-fs-{os.getpid()}-") and probe.parent == tmp_path
    dead = _dead_pid()
    stale = [fs.rename(tmp_path / f"tuner-fs-{dead}-x"), probe.rename(tmp_path / f"tuner-probe-{dead}-y")]
    ProbeRunner(Settings(storage=f"sqlite:///{tmp_path}/t.db"))
    assert not any(d.exists() for d in stale)
    tempdirs.sweep_once.cache_clear()
