"""The typer app and the one place that turns a user mistake into one clear line and exit code 2."""

from __future__ import annotations

import importlib
import os
import sys

import typer
from rich.markup import escape

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

app = typer.Typer(
    name="tuner",
    help="Finds the fastest training configuration that will not run out of memory, by short real probe trainings.",
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
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    return typer.Exit(code)


def main() -> None:
    _register()
    try:
        code = app(standalone_mode=False)  # a `raise typer.Exit(n)` comes back as n here, not as an exception
        if isinstance(code, int) and not isinstance(code, bool) and code:
            sys.exit(code)
    except TunerError as err:
        err_console.print(f"[bold red]error:[/] {escape(str(err))}")  # user text: never rich markup
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
        err_console.print(f"[bold red]error:[/] {escape(getattr(err, 'format_message', err.__str__)())}")
        sys.exit(2)
