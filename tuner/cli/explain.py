"""`tuner explain`: why the user's config runs out of memory, by phase, part and rank, matched to the OOM message
they saw, with the smallest changes that fit. The job is read exactly as `tuner search` reads it (the declared
settings, the session's request); the model is traced on CPU (short lengths, extrapolated); nothing is probed.

After a search, `tuner explain --study S --trial N` explains a probed trial instead (tuner.session.explain_trial):
its knobs and job from the stored probe, the estimate calibrated on the study's other measured probes, the trial's
measured per-phase peaks against it, and its recorded failure attributed to the estimate's parts; the same view."""

from __future__ import annotations

import shlex
from typing import Annotated, Any

import typer
from rich.text import Text

from tuner.cli.app import WORKFLOW, app, example
from tuner.cli.declared import settings_of, with_settings
from tuner.cli.explain_view import as_json, lines
from tuner.cli.safe_console import SafeConsole
from tuner.declared import EXPLAIN, JOB_PANEL, OUTPUT_PANEL, SEARCH, STORAGE_PANEL
from tuner.errors import ConfigError
from tuner.memory import oom_message
from tuner.memory.explain import Explanation, explain, explain_trial
from tuner.session.explain_job import explain_inputs
from tuner.session.explain_trial import trial_inputs
from tuner.session.options import CLI, SearchOptions
from tuner.session.session import SearchSession
from tuner.settings import load_settings
from tuner.trace_progress import shown

#: the budget of the request explain reads (its face has none: nothing is searched) and of the search it suggests
SUGGESTED_BUDGET = "1h"


@app.command(
    "explain",
    rich_help_panel=WORKFLOW,
    epilog=example(
        "tuner explain --model google/flan-t5-large --baseline ds_config.json --training-args training_args.json "
        "--transformers-version 4.46.3 "
        "--max-length 512 --max-target-length 128 --world-size 4 --device-memory 79GiB --oom-message @oom.txt"
    ),
)
@with_settings(EXPLAIN, into="settings")
def explain_command(
    ctx: typer.Context,
    settings: dict[str, Any],
    oom_text: Annotated[
        str | None,
        typer.Option(
            "--oom-message", help="the CUDA out-of-memory text you saw, or @file holding it", rich_help_panel=JOB_PANEL
        ),
    ] = None,
    trial: Annotated[
        int | None,
        typer.Option(
            "--trial",
            min=0,
            help="after a search: explain this trial of --study (default with --study and no --baseline: the first "
            "probed, the baseline when there is one) from what it measured",
            rich_help_panel=STORAGE_PANEL,
        ),
    ] = None,
    as_json_out: Annotated[
        bool, typer.Option("--json", help="print JSON instead of text", rich_help_panel=OUTPUT_PANEL)
    ] = False,
) -> None:
    """Explain why your config runs out of device memory, and which single changes fit.

    On your data: each phase's peak at the worst batch, part by part, which phase crosses the memory and when a run
    would meet it, your OOM message matched to the traced allocation of its size, and the smallest changes that fit,
    each with the search that probes it. With --study (and --trial N) after a search: a probed trial, its measured peaks
    and recorded failure against the estimate."""
    with shown():  # signs of life on stderr while it traces
        if trial is not None or (settings.get("study") is not None and settings.get("baseline") is None):
            found, search = _of_trial(settings, trial, oom_text)
        else:
            oom = oom_message.read(oom_text) if oom_text is not None else None
            from tuner.cli.search import typed

            given = {"budget": SUGGESTED_BUDGET, **settings, "given": typed(ctx, settings)}
            request, _ = SearchSession(SearchOptions.of(given), face=CLI).request()
            found, search = explain(explain_inputs(request), oom), _search_command(settings)
    if as_json_out:
        typer.echo(as_json(found))
        return
    console = SafeConsole(highlight=False, soft_wrap=True, width=100)  # stored paths and frames: no raw escapes
    for line in lines(found, search):
        console.print(Text(line))


def _of_trial(settings: dict[str, Any], trial: int | None, oom_text: str | None) -> tuple[Explanation, str]:
    """The explanation of a study's probed trial, and the search that probes a change of its job."""
    if oom_text is not None:
        raise ConfigError("--oom-message explains your config before a search; a trial's own failure is recorded")
    from tuner.storage.store import Store

    store = Store(load_settings(storage=settings.get("storage")).storage, read_only=True)
    given = trial_inputs(store, settings.get("study"), trial)
    return explain_trial(given.inputs, given.measured), given.search


def _search_command(settings: dict[str, Any]) -> str:
    """The `tuner search` of this job (the settings given, as their flags) that probes a change."""
    out = ["tuner", "search"]
    for d in settings_of(SEARCH):
        value = settings.get(d.name, SUGGESTED_BUDGET if d.name == "budget" else None)
        named = d.name == "model" and settings.get("baseline") is not None  # with their files: always named
        if value is None or value is False or (value == d.default and not named):
            continue
        flag = d.flag.split("/")[0]
        out += [flag] if value is True else [flag, str(value)]
    return " ".join(shlex.quote(a) for a in out)
