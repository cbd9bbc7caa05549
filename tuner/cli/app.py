"""The typer app and the one place that turns a user mistake into one clear line and exit code 2."""

from __future__ import annotations

import importlib
import os
import sys

import typer
from rich.markup import escape
from typer.core import TyperGroup

from trials.contract import TRUST_REMOTE_CODE_ENV
from tuner.cli.safe_console import SafeConsole
from tuner.errors import TunerError

try:  # typer >= 0.20 vendors click as typer._click; older typer uses click itself
    from typer._click.exceptions import ClickException as _VendoredClickException

    _CLICK_ERRORS: tuple[type[Exception], ...] = (_VendoredClickException,)
except ImportError:  # pragma: no cover - depends on the typer release
    _CLICK_ERRORS = ()
import click as _click

_CLICK_ERRORS = (*_CLICK_ERRORS, _click.ClickException)

#: the groups `tuner --help` lists the commands in, and the order within them: the workflow in the order a user runs it
#: (check your files, explain the crash, search, see what it changes, export), then the rest
WORKFLOW = "Workflow (in order)"
RESULTS = "Results"
LOOK_CLOSER = "Memory and data"
SETUP = "Setup and service"
COMMAND_ORDER = (
    "doctor",
    "explain",
    "search",
    "best",
    "export",
    "trials",
    "report",
    "studies",
    "estimate",
    "lengths",
    "prepare",
    "serve",
    "db",
)


def example(*commands: str) -> str:
    """A command's help epilog: the example(s) it shows (tests/docs runs each one)."""
    return "\n\n".join(f"Example: {c}" for c in commands)


class WorkflowGroup(TyperGroup):
    """Lists the commands in COMMAND_ORDER (a command missing from it comes last)."""

    def list_commands(self, ctx: typer.Context) -> list[str]:  # type: ignore[override]
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(names, key=lambda name: rank.get(name, len(rank)))


app = typer.Typer(
    name="tuner",
    help="Finds the fastest training configuration that will not run out of memory, by short real probe trainings.",
    epilog=example("tuner search --budget 2m --study demo --device-memory 160MiB"),
    cls=WorkflowGroup,
    rich_markup_mode="markdown",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = SafeConsole(stderr=True, highlight=False, soft_wrap=True)


@app.callback()
def _root(
    trust_remote_code: bool = typer.Option(
        False,
        "--trust-remote-code",
        help="run the code a model's or tokenizer's folder ships (its auto_map), here and in every probe; "
        "without it such a folder is refused in one line",
    ),
) -> None:
    """Finds the fastest training configuration that will not run out of memory, by short real probe trainings."""
    if trust_remote_code:  # the consent reaches the settings and every process this command starts
        os.environ[TRUST_REMOTE_CODE_ENV] = "1"


# Command modules register themselves on `app` when imported. One line per module.
COMMAND_MODULES = [
    "tuner.cli.serve",
    "tuner.cli.db",
    "tuner.cli.prepare",
    "tuner.cli.report",
    "tuner.cli.estimate",
    "tuner.cli.explain",
    "tuner.cli.search",
    "tuner.cli.results",
    "tuner.cli.export",
    "tuner.cli.doctor",
    "tuner.cli.lengths",
]


def _register() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Prints ``error: message`` on one line to stderr and returns the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {escape(one_line(message))}", markup=True)
    return typer.Exit(code)


#: characters of an error line at most: a message that quotes the user's text (a 3 MB key) is cut (issue 42 §9)
MAX_ERROR_CHARS = 2000


def one_line(message: str, keep: int = MAX_ERROR_CHARS) -> str:
    """``message`` as one line of at most ``keep`` characters (its newlines as spaces, the rest cut)."""
    flat = " ".join(message.splitlines())
    return flat if len(flat) <= keep else f"{flat[:keep]}... (cut at {keep:,} characters)"


def main() -> None:
    _register()
    try:
        code = app(standalone_mode=False)  # a `raise typer.Exit(n)` comes back as n here, not as an exception
        if isinstance(code, int) and not isinstance(code, bool) and code:
            sys.exit(code)
    except TunerError as err:
        err_console.print(f"[bold red]error:[/] {escape(one_line(str(err)))}")  # user text: never rich markup
        sys.exit(err.exit_code)
    except typer.Exit as ex:
        sys.exit(ex.exit_code)
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except _CLICK_ERRORS as err:  # usage errors: unknown option, bad value, missing argument
        err_console.print(f"[bold red]error:[/] {escape(one_line(getattr(err, 'format_message', err.__str__)()))}")
        sys.exit(2)
