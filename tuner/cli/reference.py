"""The command reference of the docs site, generated from the CLI itself so that it cannot drift: each command in
`tuner --help`'s order with its help, usage, example and its options grouped as its --help groups them (typer's
rich_help_panel), one Markdown table per group. The docs build (scripts/docs_hooks.py, an MkDocs hook) puts it in
docs/reference/cli.md. Pure: reads the click commands typer builds, prints nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer

from tuner.cli.app import _register, app

OTHER = "Options"  # typer's group for an option without one (--help)
_ESCAPED = re.compile(r"([\\|*_\[\]])")


def escape(text: str) -> str:
    """Text for a Markdown table cell: ``|``, ``*``, ``_``, ``<`` ... escaped outside `code spans`, newlines joined."""
    parts = text.replace("\n", " ").split("`")
    return "`".join(p if i % 2 else _plain(p) for i, p in enumerate(parts))


def _plain(text: str) -> str:
    """Text outside code spans: Markdown's characters backslash-escaped, ``<`` / ``>`` as entities (not tags)."""
    return _ESCAPED.sub(r"\\\1", text).replace("<", "&lt;").replace(">", "&gt;")


def _paragraphs(text: str) -> list[str]:
    """A docstring's paragraphs, each joined into one line (typer's markdown mode reads them so)."""
    return [escape(" ".join(line.strip() for line in p.splitlines())) for p in text.strip().split("\n\n") if p.strip()]


def _options(command: Any, ctx: typer.Context) -> Iterator[str]:
    """One table per help group, in the order the command's --help shows them."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for param in command.params:
        record = param.get_help_record(ctx)
        if record is None or getattr(param, "hidden", False):
            continue
        groups.setdefault(getattr(param, "rich_help_panel", None) or OTHER, []).append(record)
    for title in sorted(groups, key=lambda t: t != OTHER):  # typer prints its default group first
        yield f"**{title}**"
        yield ""
        yield "| option | what it does |"
        yield "|---|---|"
        for names, help_text in groups[title]:
            yield f"| `{names}` | {escape(help_text)} |"
        yield ""


def _command(path: str, command: Any, parent: typer.Context, level: int) -> Iterator[str]:
    ctx = typer.Context(command, info_name=path.split()[-1], parent=parent)
    yield f"{'#' * level} `{path}`"
    yield ""
    for paragraph in _paragraphs(command.help or ""):
        yield paragraph
        yield ""
    yield "```text"
    yield command.get_usage(ctx).replace("Usage: ", "", 1)
    yield "```"
    yield ""
    for example in (e.removeprefix("Example: ") for e in (command.epilog or "").split("\n\n") if e):
        yield "Example:"
        yield ""
        yield "```bash"
        yield example
        yield "```"
        yield ""
    yield from _options(command, ctx)
    subcommands = getattr(command, "commands", {})
    for name in command.list_commands(ctx) if subcommands else ():
        yield from _command(f"{path} {name}", subcommands[name], ctx, level + 1)


def cli_reference(level: int = 2) -> str:
    """The Markdown of every command, `tuner` itself first, its headings at ``level``."""
    _register()
    root: Any = typer.main.get_command(app)
    ctx = typer.Context(root, info_name="tuner")
    lines = [*_paragraphs(root.help or ""), "", "```text", root.get_usage(ctx).replace("Usage: ", "", 1), "```", ""]
    lines += list(_options(root, ctx))
    for name in root.list_commands(ctx):
        lines += list(_command(f"tuner {name}", root.commands[name], ctx, level))
    return "\n".join(lines) + "\n"
