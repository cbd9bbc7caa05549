"""The dashboard's pages served by the app (api.dashboard; drawn in headless Chromium by tests/e2e/test_web_dashboard):
`/` lists every study with its pick's figure, a study's page shows the pick, its exports and the trial table with
every stored string escaped, an unknown study is a 404 page, plotly.js comes from the app, and the JSON API's schema
is unchanged (the pages are not in it). SQLite and the real PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from api.app import create_app
from tests.helpers.report_study import XSS, populate_study
from tuner.records.throughput import number, throughput
from tuner.search.selection import best_stable
from tuner.settings import Settings
from tuner.storage import Store


def test_the_index_lists_every_study_with_its_picks_figure(client: TestClient, populated_url: str) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    best = best_stable(Store(populated_url).probes("t5-demo"))
    assert best is not None
    figure = throughput(best.rows)
    assert figure is not None
    assert '<a href="/ui/studies/t5-demo">t5-demo</a>' in page.text and f"{number(figure.value)} " in page.text
    assert '<a href="/ui/studies/fresh">fresh</a>' in page.text and "no stable config yet" in page.text
    study = client.get("/ui/studies/t5-demo")
    assert study.status_code == 200
    assert f'id="pick-figure">{number(figure.value)} ' in study.text
    assert all(part in study.text for part in ('id="export-deepspeed"', 'id="wall"', '<table class="trials">'))
    assert '<script type="text/javascript" src="/ui/plotly.js"></script>' in study.text
    assert client.get("/ui/studies/fresh").status_code == 200  # defined, nothing probed: the page says so
    missing = client.get("/ui/studies/nope")
    assert missing.status_code == 404 and "no study named &#x27;nope&#x27;" in missing.text
    script = client.get("/ui/plotly.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert "plotly.js" in script.text[:200]
    assert "/" not in client.get("/openapi.json").json()["paths"]


def test_stored_text_is_escaped_on_the_pages(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    populate_study(url, "hostile")
    client = TestClient(create_app(Settings(storage=url)))
    for path in ("/", "/ui/studies/hostile"):
        text = client.get(path).text
        assert XSS not in text
    assert "&lt;script&gt;document.title=" in client.get("/ui/studies/hostile").text
