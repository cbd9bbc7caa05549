"""The HTML report rendered in headless Chromium (Debian's, tests/helpers/chromium.py): no console errors, no uncaught
exceptions, the plotly plots drawn as SVG, and what they drew (plotly's graph divs' data and the DOM)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.chromium import Chromium, open_browser
from tests.helpers.report_study import CAPACITY, MiB, populate_study
from tuner.records.throughput import number
from tuner.reporting.html import write_report


@pytest.fixture()
def browser(tmp_path: Path) -> Iterator[Chromium]:
    yield from open_browser(tmp_path)


def test_error_detection_works(browser: Chromium, tmp_path: Path) -> None:
    """The positive control: a page that logs an error and throws is caught, a quiet page is not."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<html><body><script>console.log("fine");console.error("boom");'
        'throw new Error("uncaught")</script></body></html>'
    )
    browser.load(bad.as_uri())
    errors = browser.errors()
    assert any("boom" in e for e in errors) and any("uncaught" in e for e in errors)
    quiet = tmp_path / "quiet.html"
    quiet.write_text('<html><body><script>console.log("fine");console.warn("meh")</script></body></html>')
    browser.load(quiet.as_uri())
    assert browser.errors() == []


WAIT_DRAWN = """new Promise(resolve => {
  const t0 = Date.now();
  (function poll() {
    const divs = [...document.querySelectorAll('div.plotly-graph-div')];
    const drawn = '.plot .scatterlayer, .plot .barlayer, .plot .trace';
    const ok = divs.filter(d => d.querySelector('svg.main-svg') && d.querySelector(drawn));
    if ((divs.length && ok.length === divs.length) || Date.now() - t0 > 20000)
      resolve({divs: divs.length, drawn: ok.length});
    else setTimeout(poll, 100);
  })();
})"""

# What the page drew, read from plotly's graph divs (their data and layout after Plotly.newPlot) and the DOM
DRAWN = """(() => {
  const wall = document.getElementById('wall');
  const trace = name => (wall.data.find(t => t.name === name) || {x: [], y: []});
  const lines = (wall.layout.shapes || []).map(s => [s.x0, s.x1, s.line.dash || 'solid']);
  const phases = document.getElementById('phases');
  const big = [...document.scripts].filter(s => s.text.length > 100000);
  const definition = [...document.querySelectorAll('h2')].find(h => h.textContent === 'Study definition');
  return {
    title: document.title,
    points: document.querySelectorAll('.point').length,
    flags: [...document.querySelectorAll('td.flag')].map(e => e.textContent),
    wall: wall.data.map(t => t.name),
    oom: trace('out of memory, at what it needed').x,
    ruled: trace('ruled out without running').x,
    pick: [trace('the pick').x, trace('the pick').y, trace('the pick').marker && trace('the pick').marker.symbol],
    stable_y: trace('fits (stable)').y.length,
    drawn_oom: [...wall.querySelectorAll('.scatterlayer .trace')].map(t => t.querySelectorAll('.point').length),
    lines: lines,
    phase_labels: phases ? phases.data[0].x : [],
    trial_rows: document.querySelectorAll('table.trials tbody tr').length,
    pick_rows: [...document.querySelectorAll('table.trials tr.pick td:first-child')].map(e => e.textContent),
    definition_folded: definition.nextElementSibling.tagName === 'DETAILS' && !definition.nextElementSibling.open,
    scripts: big.length,
    plotly: window.Plotly.version,
    pick_figure: document.getElementById('pick-figure').textContent,
  };
})()"""


def test_report_draws_the_wall(browser: Chromium, tmp_path: Path) -> None:
    """Issue 40 §5, checked in what the browser drew: OOM probes at the memory they needed (in use + the refused
    allocation), past the capacity line; ruled-out configs where the estimate and the frontier put them; the pick
    marked at its figure; bars named by trial and config; the trial table; the definition folded; plotly.js once."""
    url = f"sqlite:///{tmp_path / 'render.db'}"
    expected = populate_study(url, "render")
    page = write_report(url, "render", tmp_path / "report.html")
    assert page.stat().st_size < 1_500_000  # a 50-probe study (it was 4.9 MB with plotly's full bundle)
    browser.load(page.as_uri())
    waited = browser.evaluate(WAIT_DRAWN)
    drawn = browser.evaluate(DRAWN)
    assert browser.errors() == []
    assert drawn["title"] == "tuner report: render"  # the hostile <script> in the stored data did not run
    assert waited["divs"] >= 7 and waited["drawn"] == waited["divs"], waited
    assert drawn["points"] > 40  # markers of the probes were drawn
    assert any(f.startswith("IMBALANCE: rank 0") for f in drawn["flags"])
    capacity = CAPACITY / MiB
    # the capacity line (solid) and the headroom line (dashed) are vertical lines on the memory axis
    assert [capacity, capacity, "solid"] in drawn["lines"] and [0.9 * capacity, 0.9 * capacity, "dash"] in drawn[
        "lines"
    ]
    # each OOM at what it needed, past the capacity: never at its pre-failure peak (504 MiB, under the line)
    assert sorted(drawn["oom"]) == sorted(v / MiB for v in expected["oom_need"].values())
    assert all(x > capacity for x in drawn["oom"])
    # ruled out: at the estimate's 700 MiB, and at the need of trial 11's OOM it needs at least as much as
    assert sorted(drawn["ruled"]) == [expected["oom_need"][11] / MiB, 700.0]
    pick_x, pick_y, symbol = drawn["pick"]
    assert symbol == "star" and pick_y == [pytest.approx(expected["best"][1])] and pick_x[0] < capacity
    assert drawn["pick_figure"] == f"{number(expected['best'][1])} retained tokens/s"
    assert 2 in drawn["drawn_oom"]  # the two OOM markers are in the SVG, not only in the data
    assert drawn["phase_labels"] == ["confirm micro=32 len=64"] and not any("None" in x for x in drawn["phase_labels"])
    assert drawn["trial_rows"] == expected["probes"]  # every probe and ruled-out config, the confirm included
    assert drawn["pick_rows"] == ["5", "- confirm"]
    assert drawn["definition_folded"]
    assert drawn["scripts"] == 1 and drawn["plotly"] == "4.1.1"
    shot = tmp_path / "report.png"
    browser.screenshot(shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    keep = os.environ.get("TUNER_REPORT_SCREENSHOT")
    if keep:  # benchmarks/report_screenshot.png is refreshed this way: TUNER_REPORT_SCREENSHOT=path pytest ...
        shutil.copyfile(shot, keep)


@pytest.mark.slow
def test_report_of_a_real_tiny_search_renders(browser: Chromium, tmp_path: Path) -> None:
    """A real `tuner search` (two 2-rank probes of the built-in tiny T5), then its report in Chromium. (One search:
    the report reads only the study it names, so a second, 1-rank study in the same file was never looked at.)"""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'search.db'}"
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch_size: [1, 2]\nmax_length: [16]\nengine: [torch]\nzero_stage: [0]\n")
    tuner = str(Path(sys.executable).with_name("tuner"))
    done = subprocess.run(
        [
            tuner,
            "search",
            "--study",
            "tiny-w2",
            "--storage",
            url,
            "--space",
            str(space),
            "--budget",
            "10m",
            "--n-trials",
            "2",
            "--finalists",
            "0",
            "--world-size",
            "2",
            "--global-batch",
            "4",
            "--device-memory",
            "1GiB",
            "--seed",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "real.html"
    done = subprocess.run(
        [tuner, "report", "--study", "tiny-w2", "-o", str(out), "--storage", url],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    browser.load(out.as_uri())
    drawn = browser.evaluate(
        """new Promise(resolve => {
             const t0 = Date.now();
             (function poll() {
               const divs = [...document.querySelectorAll('div.plotly-graph-div')];
               const ok = divs.filter(d => d.querySelector('svg.main-svg'));
               if ((divs.length && ok.length === divs.length) || Date.now() - t0 > 20000)
                 resolve({divs: divs.length, drawn: ok.length, ranks: document.body.innerText.includes('r1:')});
               else setTimeout(poll, 100);
             })();
           })"""
    )
    assert browser.errors() == []
    assert drawn["divs"] >= 5 and drawn["drawn"] == drawn["divs"], drawn
    assert drawn["ranks"], "the 2-rank probes' per-rank peaks are missing"
    shot = tmp_path / "real.png"
    browser.screenshot(shot)
    keep = os.environ.get("TUNER_REAL_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
