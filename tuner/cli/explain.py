"""`tuner explain`: why the user's config runs out of memory, by phase, part and rank, matched to the OOM message
they saw, with the smallest changes that fit. The job is read exactly as `tuner search` reads it (the declared
settings, the session's request); the model is traced on CPU (short lengths, extrapolated); nothing is probed."""

from __future__ import annotations

import shlex
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from tuner.cli.app import app
from tuner.cli.declared import settings_of, with_settings
from tuner.cli.explain_view import as_json, lines
from tuner.declared import SEARCH
from tuner.memory import oom_message
from tuner.memory.explain import explain
from tuner.session.explain_job import explain_inputs
from tuner.session.options import CLI, SearchOptions
from tuner.session.session import SearchSession

#: where `tuner explain` reads a search setting differently: nothing is searched, so no budget is needed
EXPLAIN_OWN: dict[str, dict[str, Any]] = {"budget": {"default": "1h", "help": "not used: explain probes nothing"}}


@app.command("explain")
@with_settings(SEARCH, into="settings", overrides=EXPLAIN_OWN)
def explain_command(
    settings: dict[str, Any],
    oom_text: Annotated[
        str | None,
        typer.Option("--oom-message", help="the CUDA out-of-memory text you saw, or @file holding it"),
    ] = None,
    as_json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of text")] = False,
) -> None:
    """Explain why your config runs out of device memory on your data: each phase's peak at the worst batch, part
    by part, which phase crosses the memory and when a run would meet it, your OOM message matched to the traced
    allocation of its size, and the smallest changes that fit, each with the search that probes it."""
    oom = oom_message.read(oom_text) if oom_text is not None else None
    request, _ = SearchSession(SearchOptions.of(settings), face=CLI).request()
    inputs = explain_inputs(request)
    found = explain(inputs, oom)
    if as_json_out:
        typer.echo(as_json(found))
        return
    console = Console(highlight=False, soft_wrap=True, width=100)
    for line in lines(found, _search_command(settings)):
        console.print(Text(line))


def _search_command(settings: dict[str, Any]) -> str:
    """The `tuner search` of this job (the settings given, as their flags) that probes a change."""
    out = ["tuner", "search"]
    for d in settings_of(SEARCH):
        value = settings.get(d.name)
        if value is None or value is False or value == d.default:
            continue
        flag = d.flag.split("/")[0]
        out += [flag] if value is True else [flag, str(value)]
    return " ".join(shlex.quote(a) for a in out)
