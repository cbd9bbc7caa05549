"""`tuner --help` and each command's help guide a new user: the commands in the order of the workflow, each command
with one example (tests/docs/test_docs_commands.py runs them), and `best` / `export` told apart."""

from __future__ import annotations

import subprocess
import sys

import typer

from tuner.cli.app import COMMAND_ORDER, WORKFLOW, _register, app


def _commands() -> dict[str, typer.core.TyperCommand]:
    _register()
    return typer.main.get_command(app).commands  # type: ignore[attr-defined,no-any-return]


def _help(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tuner", *args, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "100", "PATH": "/usr/bin:/bin", "TERM": "dumb"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_command_is_listed_in_workflow_order_with_one_example() -> None:
    commands = _commands()
    assert sorted(commands) == sorted(COMMAND_ORDER)  # a new command takes its place in the order
    top = _help()
    positions = [top.index(f" {name} ") for name in COMMAND_ORDER]
    assert positions == sorted(positions)
    workflow = top.split(WORKFLOW)[1].split("╰")[0]
    assert [n for n in ("doctor", "explain", "search", "best", "export") if f" {n} " in workflow] == [
        "doctor",
        "explain",
        "search",
        "best",
        "export",
    ]
    for name, command in commands.items():
        examples = [c for c in (command.epilog or "").split("\n\n") if c]
        if isinstance(command, typer.core.TyperGroup):  # `tuner db`: its subcommands carry the examples
            examples = [c.epilog for c in command.commands.values()]
        assert examples and all(e.startswith(f"Example: tuner {name}") for e in examples), name
    # `tuner --help`'s own example (a 2-minute search like scripts/quickstart.sh's, which tests/docs runs) parses
    from tests.helpers.docs_blocks import command_of, tuner_argv

    (example,) = (app.info.epilog or "").removeprefix("Example: ").split("\n\n")
    command, _ = command_of(tuner_argv(example) or [])
    assert command.name == "search"


def test_a_commands_help_groups_its_flags_and_shows_its_example() -> None:
    text = _help("search")
    groups = [title for title in ("Your job", "Your data", "Search", "Storage") if f"─ {title} " in text]
    assert groups == ["Your job", "Your data", "Search", "Storage"]
    assert text.index("--model") < text.index("--dataset") < text.index("--budget") < text.index("--storage")
    assert "Example: tuner search --budget 2h" in text


def test_best_and_export_say_how_they_differ() -> None:
    best, export = _help("best"), _help("export")
    assert "--changes" in best and "tuner export" in best
    assert "tuner best" in export
    options = {name: {p.name for p in c.params} for name, c in _commands().items()}
    assert "changes" in options["best"] and "changes" not in options["export"]
    assert {"fmt", "output", "study", "storage", "transformers_version"} <= options["best"] & options["export"]


def test_the_reference_renders_help_text_as_written() -> None:
    """The docs' command reference (tuner.cli.reference) escapes what Markdown would read as markup: a help's
    `<preset>`, `|`, `*` and `_` come out as typed, `code spans` as code."""
    import html
    import re

    import markdown

    from tuner.cli.reference import cli_reference, escape

    cell = escape("builtin:<preset> a|b 2*len a_b `x<y>`")
    rendered = markdown.markdown(f"| a |\n|---|\n| {cell} |", extensions=["tables"])
    assert (
        html.unescape(re.sub(r"<(?!preset)[^>]+>", "", rendered))
        .strip()
        .endswith("builtin:<preset> a|b 2*len a_b x<y>")
    )
    page = cli_reference()
    assert (
        all(f"## `tuner {name}`" in page for name in COMMAND_ORDER if name != "db") and "### `tuner db upgrade`" in page
    )
