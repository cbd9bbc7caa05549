"""`tuner report` on real storage populated through the same public writers the search uses (Store, Optuna): the
study comes from tests/report_study.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.helpers.report_study import CAPACITY, HEADROOM, XSS, populate_study
from tuner.errors import ConfigError, StudyNotFound
from tuner.records.throughput import number
from tuner.reporting.html import load, render_html, write_report
from tuner.storage.db import optuna_storage
from tuner.storage.store import Store


@pytest.fixture()
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'report.db'}"


def test_report_shows_plots_best_config_and_flags(url: str, tmp_path: Path) -> None:
    expected = populate_study(url, "rep")
    data = load(url, "rep")
    assert len(data.rows) == expected["probes"]
    assert data.best is not None
    best_params, best_value = expected["best"]
    assert {k: data.best.knobs[k] for k in best_params} == best_params
    assert data.best.objective == pytest.approx(best_value)
    assert data.capacity == CAPACITY and data.headroom == HEADROOM
    # the export is tuner.interop.export's: DeepSpeed JSON with consistent batch fields, and every other format
    assert set(data.exports) == {"deepspeed", "hf", "accelerate", "env", "json"}
    ds = json.loads(data.exports["deepspeed"])
    accum = data.best.config["gradient_accumulation_steps"]
    assert ds["train_micro_batch_size_per_gpu"] == best_params["micro_batch_size"]
    assert ds["train_batch_size"] == best_params["micro_batch_size"] * accum * 1
    assert ds["zero_optimization"]["stage"] == best_params["zero_stage"]
    assert not any(text.startswith("(cannot render") for text in data.exports.values())

    out = write_report(url, "rep", tmp_path / "report.html")
    page = out.read_text()
    # self-contained: plotly.js (its basic bundle) inlined once, no external script or stylesheet
    assert page.count("plotly.js (basic - minified) v") == 1 and page.count("<script") == page.count("</script>")
    assert len(page) < 1_500_000
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=\"http", page)
    # the wall, the other plots and the optuna views, each as a plotly div (what they draw: tests/e2e)
    for title in (
        "The wall: throughput against the memory of the fullest rank",
        "Throughput per probe over time",
        "Peak memory vs micro batch",
        "Peak memory per phase",
        "OOM frontier",
        "Peak memory per rank",
    ):
        assert title in page, title
    assert len(re.findall(r'<div id="[\w-]+" class="plotly-graph-div"', page)) >= 7
    assert "capacity" in page and "headroom 90%" in page
    # probes counted as probes: the ones that ran, apart from configs ruled out without running
    ran = sum(1 for r in data.rows if r.measured)
    inferred = sum(1 for r in data.rows if str(r.fidelity) == "inferred")
    assert f"<td>probes run</td><td>{ran}</td>" in page
    assert inferred == 0 or f"<td>ruled out without running (inferred-oom)</td><td>{inferred}</td>" in page
    # chosen config and its export
    assert "Chosen config" in page and "No stable config yet" not in page
    assert f'id="pick-figure">{number(best_value)} retained tokens/s<' in page  # the figure every face shows
    assert "train_micro_batch_size_per_gpu" in page and "<summary>deepspeed</summary>" in page
    # the imbalanced 2-rank probe is flagged with its likely causes
    assert 'class="flag">IMBALANCE: rank 0 peaks 67% above rank 1' in page
    assert "rank-0 gathering" in page and "DataParallel" in page and "uneven data" in page
    # stored strings are escaped: the hostile cause and definition never become markup
    assert XSS not in page
    assert "&lt;script&gt;document.title=" in page
    # the study definition folded, not screens of JSON
    assert re.search(r"<h2>Study definition</h2><details><summary>[^<]+</summary><pre>", page)


def test_report_of_a_study_without_probes_says_so(url: str, tmp_path: Path) -> None:
    Store(url).ensure_study("empty", {"device_memory": CAPACITY})
    page = render_html(load(url, "empty"))
    assert "No stable config yet" in page
    assert "No multi-rank probes" in page
    assert "nothing to plot yet" not in page or "no measured probes yet" in page


def test_report_of_an_optuna_only_study(url: str) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="plain", storage=optuna_storage(url), direction="maximize")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    page = render_html(load(url, "plain"))
    assert "Optuna views" in page and "Optimization History" in page


def test_unknown_study_and_bad_output_are_user_errors(url: str, tmp_path: Path) -> None:
    Store(url)
    with pytest.raises(StudyNotFound, match="no study named 'nope'"):
        load(url, "nope")
    populate_study(url, "rep", two_rank_imbalance=False)
    with pytest.raises(ConfigError, match="is a directory"):
        write_report(url, "rep", tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        write_report(url, "rep", tmp_path / "missing" / "r.html")


def test_cli_report_writes_the_page(url: str, tmp_path: Path) -> None:
    populate_study(url, "clirep")
    out = tmp_path / "r.html"
    tuner = Path(sys.executable).with_name("tuner")
    done = subprocess.run(
        [str(tuner), "report", "--study", "clirep", "-o", str(out), "--storage", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert out.exists() and "Chosen config" in out.read_text()
    assert str(out) in done.stdout
    bad = subprocess.run(
        [str(tuner), "report", "--study", "nope", "-o", str(out), "--storage", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "no study named 'nope'" in bad.stderr
    assert "Traceback" not in bad.stderr
