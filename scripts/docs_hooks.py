"""MkDocs hook (mkdocs.yml `hooks:`): the command reference page gets the CLI's own help, rendered at build time by
tuner.cli.reference, in place of the marker line; a page without the marker is left as it is."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from tuner.cli.reference import cli_reference

    return markdown.replace(MARKER, cli_reference(level=2))
