"""The dashboard at `/`: a small read-only page over the same storage as the JSON API — the studies (status, best
figure), and per study its pick with the exports to copy, the wall and the other report plots, and the trial table
(status, cause, throughput, memory and peak per phase). Server-rendered from the report's own sections
(tuner.reporting.sections): plain string building, every stored string escaped; plotly.js (its basic bundle,
tuner.reporting.plotly_js) served by the app itself at /ui/plotly.js, so it works offline. Reads only; no torch."""

from __future__ import annotations

import html
import urllib.parse

from api.deps import Services
from api.views import ranked, study_status
from tuner.errors import StudyNotFound
from tuner.records.study import StudyRecord
from tuner.records.throughput import throughput
from tuner.reporting.data import load_rows
from tuner.reporting.html import page
from tuner.reporting.sections import COPY_SCRIPT, Figures, body, table
from tuner.session.best import rank
from tuner.settings import public_url
from tuner.storage.read_pool import ReadStore

PLOTLY_PATH = "/ui/plotly.js"
NAV = '<p class="sub"><a href="/">all studies</a> · JSON: <a href="/studies">/studies</a> · <a href="/docs">API</a></p>'


def study_href(name: str) -> str:
    return "/ui/studies/" + urllib.parse.quote(name, safe="")


def _e(text: object) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def _best_cell(store: ReadStore, svc: Services, study: StudyRecord) -> tuple[str, str]:
    """The pick's figure and the probes run, cached per version of the study's rows (the ranking cache holds a few
    studies only: an index of many would rank them all again on every view)."""
    from tuner.job.objective import Objective

    def build() -> tuple[str, str]:
        rows, best = rank(store, study.name)
        unit = Objective.from_dict(study.definition.objective).unit
        figure = throughput(best.rows) if best is not None else None
        probes = sum(1 for r in rows if r.measured)
        return (figure.text(unit) if figure is not None else "no stable config yet"), str(probes)

    return svc.cache.get(store, study.name, "index", build)


def index_page(store: ReadStore, svc: Services) -> str:
    """The studies, newest first: name (a link to its page), status, created, model, probes run, the pick's figure."""
    now = store.db_now()
    rows = []
    for study in store.studies():
        best, probes = _best_cell(store, svc, study)
        status = study_status(store.runs(study.name), now)
        link = f'<a href="{_e(study_href(study.name))}">{_e(study.name)}</a>'
        cells = [link, _e(status), _e(str(study.created_at)[:19]), _e(study.definition.model_source or "-")]
        cells += [_e(probes), _e(best)]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("study", "status", "created", "model", "probes run", "the pick"))
    listing = (
        f'<table id="studies"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
        if rows
        else '<p class="empty">No studies yet: run `tuner search --budget 30m`.</p>'
    )
    parts = [
        "<h1>tuner</h1>",
        f'<p class="sub">studies in {_e(public_url(svc.settings.storage))} · read-only · JSON: '
        '<a href="/studies">/studies</a>, /best-config?study=NAME · <a href="/docs">API</a></p>',
        listing,
    ]
    return page("tuner: studies", parts, "")


def _use_it(name: str) -> str:
    """How to take the pick from here: the commands and the URL, to copy."""
    quoted = urllib.parse.quote(name, safe="")
    lines = [
        f"tuner best --study {name} --changes",
        f"tuner export --study {name} --format deepspeed -o ds_config.json",
        f"curl 'http://HOST/best-config?study={quoted}&format=deepspeed&raw=true' > ds_config.json",
    ]
    text = "\n".join(lines)
    return (
        '<h3>Take it</h3><button class="copy" type="button" data-copy="use-it">copy</button>'
        f'<pre id="use-it">{_e(text)}</pre>'
    )


def study_sections(store: ReadStore, svc: Services, name: str) -> str:
    """The study's sections (the report's), built once per version of its probe rows (api.cache)."""

    def build() -> str:
        definition = store.definition(name)
        rows = ranked(store, svc, name).rows
        data = load_rows(name, definition, rows)
        parts = body(data, Figures())
        if data.best is not None:
            at = parts.index("<h2>Chosen config</h2>") + 2
            parts.insert(at, _use_it(name))
        return "\n".join(parts)

    return svc.cache.get(store, name, "dashboard", build)


def study_page(store: ReadStore, svc: Services, name: str) -> str:
    """One study: its status line (live: not cached), then its sections; StudyNotFound for an unknown name."""
    study = store.study(name)
    if study is None:
        raise StudyNotFound(f"no study named {name!r} in this storage; the list is at /")
    status = study_status(store.runs(name), store.db_now())
    facts = table(["", ""], [["status", status], ["created", str(study.created_at)[:19]]])
    sections = study_sections(store, svc, name)
    parts = [f"<h1>Study {_e(name)}</h1>", NAV, facts, sections, f"<script>{COPY_SCRIPT}</script>"]
    script = f'<script type="text/javascript" src="{PLOTLY_PATH}"></script>'
    return page(f"tuner: {name}", parts, script)


def not_found_page(message: str) -> str:
    return page("tuner: not found", [f"<h1>Not found</h1><p>{_e(message)}</p>", NAV], "")


__all__ = ["PLOTLY_PATH", "index_page", "not_found_page", "study_href", "study_page"]
