"""The dashboard at `/` (issue 40 §6) in headless Chromium, over a study made by a real `tuner search` (two 1-rank
probes of the built-in tiny T5) served by a real `tuner serve`: the page loads without console errors or any request
off the server, lists the study, and its page shows the pick — the same figure every other face prints for it
(issue 38 "one number per pick": the search's summary, `tuner trials`, `tuner export`, GET /best-config) — with its
exports to copy, the wall drawn and the trial table."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.chromium import Chromium, open_browser
from tests.helpers.servers import TUNER_BIN, clean_env, start_server, stop
from tuner.records.throughput import number

pytestmark = pytest.mark.slow

WAIT = """new Promise(resolve => {
  const t0 = Date.now();
  (function poll() {
    const divs = [...document.querySelectorAll('div.plotly-graph-div')];
    const ok = divs.filter(d => d.querySelector('svg.main-svg') && d.querySelector('.plot .trace'));
    if ((divs.length && ok.length === divs.length) || Date.now() - t0 > 20000) resolve(divs.length - ok.length);
    else setTimeout(poll, 100);
  })();
})"""

PAGE = """(() => ({
  title: document.title,
  figure: (document.getElementById('pick-figure') || {}).textContent,
  deepspeed: (document.getElementById('export-deepspeed') || {}).textContent,
  wall: document.getElementById('wall').data.map(t => t.name),
  rows: document.querySelectorAll('table.trials tbody tr').length,
  pick_rows: document.querySelectorAll('table.trials tr.pick').length,
  plotly: window.Plotly && window.Plotly.version,
  hosts: [...new Set(performance.getEntriesByType('resource').map(r => new URL(r.name).host))],
}))()"""


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Chromium]:
    yield from open_browser(tmp_path)


def _search(tmp_path: Path, url: str) -> str:
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch_size: [1, 2]\nmax_length: [16]\nengine: [torch]\nzero_stage: [0]\n")
    argv = [TUNER_BIN, "search", "--study", "web", "--storage", url, "--space", str(space), "--budget", "10m"]
    argv += ["--n-trials", "2", "--finalists", "0", "--global-batch", "4", "--device-memory", "1GiB", "--seed", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_dashboard_lists_a_real_study_and_shows_its_pick(browser: Chromium, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'web.db'}"
    summary = _search(tmp_path, url)
    proc, base = start_server(url)
    try:
        best = httpx.get(f"{base}/best-config", params={"study": "web"}, timeout=30).json()
        figure = f"{number(best['objective'])} samples/s"
        browser.load(base + "/")
        listed = browser.evaluate(
            "[...document.querySelectorAll('#studies tbody tr')].map(r => [...r.cells].map(c => c.textContent))"
        )
        assert browser.errors() == []
        assert [row[0] for row in listed] == ["web"] and listed[0][-1] == figure, listed
        link = browser.evaluate("document.querySelector('#studies a').getAttribute('href')")
        browser.load(base + link)
        assert browser.evaluate(WAIT) == 0
        page = browser.evaluate(PAGE)
        assert browser.errors() == []
        assert page["title"] == "tuner: web" and page["figure"] == figure
        micro = best["knobs"]["micro_batch_size"]
        assert f'"train_micro_batch_size_per_gpu": {micro}' in page["deepspeed"]
        assert "fits (stable)" in page["wall"] and "the pick" in page["wall"]
        assert page["rows"] == 2 and page["pick_rows"] == 1
        assert page["plotly"] and page["hosts"] == [base.removeprefix("http://")]  # plotly.js from the app, offline
        browser.evaluate("document.querySelector('button.copy[data-copy=\"export-deepspeed\"]').click()")
        assert (
            browser.evaluate(
                "new Promise(r => setTimeout(() => r(document.querySelector("
                "'button.copy[data-copy=\"export-deepspeed\"]').textContent), 300))"
            )
            == "copied"
        )
        # one number per pick: the search's summary, `tuner trials`, `tuner export` print the dashboard's figure
        assert f"  {figure} (" in summary, summary
        trials = subprocess.run(
            [TUNER_BIN, "trials", "--study", "web", "--storage", url], capture_output=True, text=True, timeout=120
        )
        pick = [line.split("\t") for line in trials.stdout.splitlines() if "\tok pick\t" in line]
        assert len(pick) == 1 and pick[0][2] == number(best["objective"]), trials.stdout
        export = subprocess.run(
            [TUNER_BIN, "export", "--study", "web", "--storage", url, "-o", str(tmp_path / "ds.json")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert export.returncode == 0 and figure in export.stdout + export.stderr, export.stderr
    finally:
        stop(proc)
