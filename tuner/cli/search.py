"""`tuner search --budget 2h ...`: the OOM-aware search with a live progress display and a final summary."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from tuner.cli.app import WORKFLOW, app, example
from tuner.cli.declared import with_settings
from tuner.cli.progress import LiveProgress, summary_table
from tuner.cli.safe_console import SafeConsole
from tuner.declared import SEARCH, SEARCH_PANEL
from tuner.search.request import SearchRequest
from tuner.session.driver import Listener
from tuner.session.options import CLI, SearchOptions
from tuner.session.session import Events, SearchSession
from tuner.settings import redact_url
from tuner.units import Deadline

console = SafeConsole(highlight=False, soft_wrap=True)
if not console.is_terminal:  # logs and pipes: wide rows instead of 80 columns folded
    console = SafeConsole(highlight=False, soft_wrap=True, width=200)


class Rendered(Events):
    """A search session's events on the terminal: spinners for the slow steps, the study's header, the live
    progress display (tuner.cli.progress)."""

    def step(self, what: str) -> AbstractContextManager[Any]:
        return console.status(what)

    def opened(self, request: SearchRequest, resumed: bool) -> None:
        console.print(
            f"{'resuming' if resumed else 'new'} study [bold]{escape(request.study_name)}[/] on "
            f"{escape(redact_url(request.storage))}: {escape(request.model.source)}, world size "
            f"{request.world_size}{_nodes(request)}, global batch {request.global_batch}"
        )
        held = f"your job (held fixed): {request.job.describe()}; " if request.job is not None else ""
        console.print(Text(f"{held}searching {request.space.size()} configs for {request.objective.unit}"))
        if request.sources:
            console.print(Text(f"  {request.sources}"), style="dim")
        for line in request.data_lines():
            console.print(Text(line))
        if request.job_changes:
            console.print(
                f"[yellow]the space file searches job settings on purpose: {escape(', '.join(request.job_changes))}; "
                "the pick may change your job's results[/]"
            )

    def node(self, line: str) -> None:
        console.print(line, style="dim", markup=False)

    def estimated(self, note: str | None) -> None:
        if note:
            console.print(note, style="dim", markup=False)

    @contextmanager
    def running(self, request: SearchRequest, deadline: Deadline) -> Iterator[Listener | None]:
        progress = LiveProgress(
            console, deadline, request.objective, request.study_name, _job(request), crash=baseline_crash(request)
        )
        with progress:
            yield progress


def baseline_crash(request: SearchRequest) -> Callable[[Mapping[str, Any]], str | None] | None:
    """The crash line the stream prints under the baseline's row when the study has data and a trace: the one
    `tuner trials` prints (tuner.session.crash_line.study_crash: the stored summary, the estimate from the stored trace
    calibrated on the study's measured probes, the baseline's own row among them). None without data."""
    if request.data is None:
        return None

    def line(knobs: Mapping[str, Any]) -> str | None:
        from tuner.session.crash_line import study_crash
        from tuner.storage import Store

        store = Store(request.storage, read_only=True)
        definition = store.definition(request.study_name)
        crash = study_crash(definition, store.probes(request.study_name)) if definition is not None else None
        return crash.line(knobs, "your config") if crash is not None else None

    return line


def _nodes(request: SearchRequest) -> str:
    """`` (2 nodes x 4 ranks; its budget: 1.00 node-hours)`` for a search across nodes, else nothing."""
    if request.nnodes == 1:
        return ""
    from tuner.session.plan import node_hours_text

    hours = node_hours_text(request.budget_s, request.nnodes).removeprefix(" = ")
    return f" ({request.nnodes} nodes x {request.world_size // request.nnodes} ranks; its budget: {hours})"


def _job(request: SearchRequest) -> dict[str, Any] | None:
    return request.job.model_dump(mode="json") if request.job is not None else None


def typed(ctx: typer.Context, settings: dict[str, Any]) -> frozenset[str]:
    """The settings typed on the command line (or set by an environment variable), even at their default value."""
    sources = {name: ctx.get_parameter_source(name) for name in settings}
    return frozenset(name for name, s in sources.items() if s is not None and s.name in ("COMMANDLINE", "ENVIRONMENT"))


@app.command(
    "search",
    rich_help_panel=WORKFLOW,
    epilog=example(
        "tuner search --budget 2h --model google/flan-t5-large --baseline ds_config.json --training-args "
        "training_args.json --transformers-version 4.46.3 --max-length 512 --max-target-length 128 --world-size 4 "
        "--study flan-large"
    ),
)
@with_settings(SEARCH, into="settings")
def search(
    ctx: typer.Context,
    settings: dict[str, Any],
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="say what the search would do (job, space, estimate, probes, time); write and probe nothing",
            rich_help_panel=SEARCH_PANEL,
        ),
    ] = False,
) -> None:
    """Find the fastest config that does not run out of memory, by short real probe trainings."""
    session = SearchSession(SearchOptions.of({**settings, "given": typed(ctx, settings)}), face=CLI, events=Rendered())
    if dry_run:
        request, found = session.plan()
        for line in found.lines(request):
            console.print(Text(line))
        return
    ran = session.run()
    summary, request = ran.summary, ran.request
    console.print(summary_table(summary, request.objective, _job(request)))
    if summary.best is None:
        from tuner.session.no_pick import why_no_pick
        from tuner.storage import Store

        rows = Store(request.storage, read_only=True).probes(request.study_name)
        console.print(Text(f"no stable config found: {why_no_pick(rows)}"))
