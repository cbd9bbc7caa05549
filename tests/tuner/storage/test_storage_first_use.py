"""Several processes first-using one fresh database at once (workers starting together, the API beside a search)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_concurrent_first_use_of_one_sqlite_file_all_succeed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'race.db'}"
    code = (
        "from tuner.storage import Store, optuna_storage; "
        f"Store({url!r}); optuna_storage({url!r}, heartbeat_interval=None, grace_period=None); print('ok')"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    results = [(p.communicate(timeout=300), p.returncode) for p in procs]
    failures = [err[-800:] for (_out, err), rc in results if rc != 0]
    assert not failures, failures
    assert all(out.strip() == "ok" for (out, _err), _rc in results)
