"""One number per pick (issue 38): a pick probed three times (89.1, 80.1 and 75.0 samples/s) beside a baseline measured
at 53.7 shows 80.1 samples/s — the median of its probes — in the search's summary, `tuner best --changes`, `tuner
trials`, `tuner export`, the report, ``GET /best-config`` and ``tuner.best_config``; and every speed-up printed is the
ratio of the two numbers printed beside it (1.49x = 80.1 / 53.7). Real storage, the faces' own code."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from rich.console import Console

import tuner
from api.app import create_app
from tests.helpers.sample_storage import SampleStudy
from tuner.cli.progress import summary_table
from tuner.job.objective import Objective
from tuner.records.throughput import Throughput, number, speedup, speedup_text, throughput
from tuner.reporting.html import load, render_html
from tuner.search.selection import best_stable
from tuner.session.driver import SearchSummary
from tuner.settings import Settings
from tuner.storage import Store

MiB = 1 << 20
TUNER = str(Path(sys.executable).with_name("tuner"))
PICK = {"micro_batch_size": 4, "max_length": 64, "zero_stage": 2}
BASE = {"micro_batch_size": 1, "max_length": 64, "zero_stage": 2}
LINE = "1.49x the throughput of your config (53.7 -> 80.1 samples/s)"


def _row(sample: SampleStudy, trial: int | None, fidelity: str, knobs: dict, key: str, speed: float) -> None:
    peak = (100 if key == "pick" else 60) * MiB
    result = {"status": "ok", "ranks": [{"rank": 0, "peak_allocated": peak, "peak_reserved": peak}]}
    sample.record(
        trial_number=trial,
        fidelity=fidelity,
        config_key=key,
        knobs=knobs,
        config={"world_size": 1, "gradient_accumulation_steps": 32 // knobs["micro_batch_size"]},
        status="ok",
        objective=speed,
        samples_per_s=speed,
        peak_allocated=peak,
        capacity=160 * MiB,
        stable=True,
        result=result,
    )


@pytest.fixture()
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'one.db'}"
    sample = SampleStudy(url, "one", {"model": "builtin:tiny-t5", "world_size": 1, "device_memory": 160 * MiB})
    import optuna

    sample.distributions = {
        "micro_batch_size": optuna.distributions.IntDistribution(1, 8),
        "max_length": optuna.distributions.CategoricalDistribution([64]),
        "zero_stage": optuna.distributions.IntDistribution(0, 3),
    }
    _row(sample, 0, "baseline", BASE, "base", 53.7)
    sample.trial(BASE, "ok", 53.7)
    _row(sample, 1, "short", PICK, "pick", 89.1)
    sample.trial(PICK, "ok", 89.1)
    _row(sample, None, "confirm", PICK, "pick", 80.1)
    _row(sample, None, "confirm", PICK, "pick", 75.0)
    return url


def test_the_figure_and_the_speedup_are_one_function() -> None:
    pick, base = Throughput(80.1, 80.1, 3), Throughput(53.66, 53.66, 1)
    assert number(80.06) == "80.1" and number(5.0) == "5.00" and number(1234.5) == "1,234.5" and number(None) == "-"
    assert speedup(pick, base) == pytest.approx(80.1 / 53.7)  # the numbers as printed, not 80.1 / 53.66
    assert speedup_text(pick, base, "samples/s") == LINE
    assert throughput([]) is None


def test_every_face_shows_the_median_and_the_ratio_of_what_it_prints(url: str, tmp_path: Path) -> None:
    rows = Store(url).probes("one")
    best = best_stable(rows)
    assert best is not None and best.config_key == "pick" and best.objective < 80.1  # the ranking's lower bound
    # the search's summary
    summary = SearchSummary("one", 1, 60.0, "budget", {"ok": 4}, best, rows[0], 4, 30.0, 2)
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(summary_table(summary, Objective()))
    assert LINE in out.getvalue() and "  80.1 samples/s (the median of its 3 probes: 89.1, 80.1, 75.0" in out.getvalue()
    # GET /best-config and tuner.best_config
    body = TestClient(create_app(Settings(storage=url))).get("/best-config", params={"study": "one"}).json()
    assert body["samples_per_s"] == body["objective"] == pytest.approx(80.1)
    assert body["baseline"]["samples_per_s"] == pytest.approx(53.7) and body["baseline"]["speedup"] == pytest.approx(
        80.1 / 53.7
    )
    assert LINE in body["changes"]["lines"]
    python = tuner.best_config("one", storage=url)
    assert python.samples_per_s == pytest.approx(80.1) and LINE in python.changes
    # the report
    data = load(url, "one")
    assert data.pick is not None and data.pick[1].value == pytest.approx(80.1) and data.verdict == LINE
    assert 'id="pick-figure">80.1 samples/s<' in render_html(data)

    # the CLI: `tuner best --changes`, `tuner trials --json` and its table, `tuner export`
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([TUNER, *argv, "--storage", url], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    assert LINE in run("best", "--study", "one", "--changes").stdout
    listed = [json.loads(line) for line in run("trials", "--study", "one", "--json").stdout.splitlines()]
    assert [(r["trial"], r["objective"]) for r in listed if r["pick"]] == [(1, pytest.approx(80.1))]
    table = run("trials", "--study", "one").stdout.splitlines()
    assert [line.split("\t")[:3] for line in table if "pick" in line] == [["1", "ok pick", "80.1"]]
    exported = run("export", "--study", "one", "-o", str(tmp_path / "ds.json"))
    assert "80.1 samples/s, the median of its 3 probes" in exported.stdout + exported.stderr
