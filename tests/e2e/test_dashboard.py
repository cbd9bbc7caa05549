"""optuna-dashboard and the optuna CLI read our storage unchanged: our tables sit next to Optuna's without hiding or
breaking anything. Real processes on a temp SQLite file, real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.report_study import populate_study
from trials.contract import free_port

BIN = Path(sys.executable).parent


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


@pytest.fixture()
def storage(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    url = f"sqlite:///{tmp_path / 'dash.db'}"
    expected = populate_study(url, "dash-study")
    return url, expected


def test_optuna_dashboard_lists_our_study(storage: tuple[str, dict[str, Any]], tmp_path: Path) -> None:
    url, expected = storage
    port = free_port()
    log = (tmp_path / "dashboard.log").open("w")
    proc = subprocess.Popen(
        [str(BIN / "optuna-dashboard"), url, "--host", "127.0.0.1", "--port", str(port), "--server", "wsgiref"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                _get(base + "/api/meta")
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, (tmp_path / "dashboard.log").read_text()
                assert time.monotonic() < deadline, "optuna-dashboard did not start in 60 s"
                time.sleep(0.3)
        summaries = _get(base + "/api/studies")["study_summaries"]
        names = {s["study_name"]: s for s in summaries}
        assert "dash-study" in names
        summary = names["dash-study"]
        assert summary["directions"] == ["maximize"]
        detail = _get(f"{base}/api/studies/{summary['study_id']}")
        states = [t["state"] for t in detail["trials"]]
        assert len(states) == expected["ok"] + expected["oom"]
        assert states.count("Complete") == expected["ok"] and states.count("Pruned") == expected["oom"]
        best_params, best_value = expected["best"]
        assert detail["best_trials"][0]["values"] == [pytest.approx(best_value)]
        params = {p["name"]: p for p in detail["best_trials"][0]["params"]}
        assert {k: int(float(params[k]["param_internal_value"])) for k in ("micro_batch_size", "zero_stage")} == {
            k: best_params[k] for k in ("micro_batch_size", "zero_stage")
        }
        assert {p["name"] for p in detail["union_search_space"]} == {"micro_batch_size", "max_length", "zero_stage"}
        # the HTML app itself is served
        with urllib.request.urlopen(base + "/dashboard", timeout=10) as resp:
            assert resp.status == 200 and b"<html" in resp.read().lower()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    assert "Traceback" not in (tmp_path / "dashboard.log").read_text()


def test_optuna_cli_reads_our_storage(storage: tuple[str, dict[str, Any]]) -> None:
    url, expected = storage
    done = subprocess.run(
        [str(BIN / "optuna"), "studies", "--storage", url, "-f", "json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    studies = {s["name"]: s for s in json.loads(done.stdout)}
    assert studies["dash-study"]["n_trials"] == expected["ok"] + expected["oom"]
    best = subprocess.run(
        [str(BIN / "optuna"), "best-trial", "--study-name", "dash-study", "--storage", url, "-f", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["value"] == pytest.approx(expected["best"][1])
