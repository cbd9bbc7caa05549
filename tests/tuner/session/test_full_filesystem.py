"""A full and a read-only filesystem under a SQLite study mid-search (issue 24 §1): 0 measurements lost, the stop line
says "kept" only where the row is kept and names the place, and the resume names the real cause, not "killed".

Each case runs tests.helpers.small_filesystem in a private mount namespace (``unshare -rm``: a real 4 MiB tmpfs, no
root on the host needed); see that module for the fault and the replayed probes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d; rc=$?; rmdir $d; exit $rc"
    return subprocess.run(["unshare", "-rm", "sh", "-c", probe], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount(), reason="this host allows no user mount namespace (unshare -rm)")
@pytest.mark.parametrize("mode", ["full", "ro"])
def test_a_full_or_read_only_filesystem_loses_no_measurement(mode: str, tmp_path: Path) -> None:
    done = subprocess.run(
        ["unshare", "-rm", sys.executable, "-m", "tests.helpers.small_filesystem", mode, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    first, db = out["first"], out["db"]
    line = first["stopped"]
    assert line is not None and "storage refused" in line and first["probes"] == 2, out
    cache = tmp_path / "cache" / "journal"
    # the row being recorded is kept in the cache dir (the folder beside the database refused it), and said so
    assert f"1 finished probe(s) not stored are kept in {cache}/" in line, line
    assert ".journal.d" not in line and "could not be written" not in line, line
    # 0 measurements lost: every probe the stopped run finished has its row, stored by the resume from the journal
    first_run = db["runs"][0][0]
    measured = [r for r in db["rows"] if r[0] == first_run and not r[2].startswith("inferred")]
    assert len(measured) == first["probes"], db
    assert out["resumed"]["stopped"] is None and db["journals"] == [], out
    # the stopped run is closed with the real cause, and no trial is said to have been killed
    status, message = db["runs"][0][1], db["runs"][0][2]
    assert status == "interrupted" and "stopped on a storage error" in message, db["runs"]
    assert "killed" not in message and not any("killed" in cause for _, cause in db["causes"]), db
