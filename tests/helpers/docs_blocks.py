"""The `bash` blocks of the README and the docs site, their markers, and the two ways a test checks a command: runs it
(with the options its marker sets) or parses it with the real command line. docs/reference/development.md says what
each marker means; tests/docs/test_docs_commands.py runs them.

A marker is an HTML comment on the first non-blank line after a block's closing fence: ``<!-- docs-test: run -->``,
``<!-- docs-test: run with --budget 1m -->``, ``<!-- docs-test: parse: REASON -->``,
``<!-- docs-test: quickstart -->``."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- docs-test: (run|run with (?P<with>.+?)|parse: (?P<why>.+?)|quickstart) -->$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)")
SHELL_OPERATORS = frozenset({"|", "||", "&&", ";", ">", ">>", "<", "&", "(", ")"})


@dataclass(frozen=True)
class Block:
    """One fenced `bash` block: where it is, its commands (continuation lines joined), and its marker."""

    page: str  # relative to the repository root
    line: int  # the opening fence's line, 1-based
    text: str
    marker: str | None  # "run", "run with ...", "parse: ...", "quickstart"; None: no marker

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def commands(self) -> list[str]:
        """Each command of the block: continuation lines joined, blank and comment-only lines dropped."""
        out: list[str] = []
        pending = ""
        for raw in self.text.splitlines():
            line = raw.strip()
            if not pending and (not line or line.startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            out.append(pending + line)
            pending = ""
        return out

    @property
    def options(self) -> list[tuple[str, str]]:
        """The (option, value) pairs of a ``run with`` marker."""
        marker = self.marker or ""
        tokens = shlex.split(marker.removeprefix("run with ")) if marker.startswith("run with ") else []
        return list(zip(tokens[::2], tokens[1::2], strict=True))


def bash_blocks(page: Path) -> list[Block]:
    """The `bash` blocks of a Markdown file, each with the marker on the first non-blank line after it."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, start = opening.group("indent"), i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1  # the closing fence
        if opening.group("lang") != "bash":
            continue
        after = next((line.strip() for line in lines[i:] if line.strip()), "")
        marker = after[len("<!-- docs-test: ") : -len(" -->")] if MARKER.match(after) else None
        out.append(Block(str(page.relative_to(ROOT)), start + 1, "\n".join(body), marker))
    return out


def tokens(command: str) -> list[str]:
    """A command's words as bash splits them, comments dropped, operators (``|``, ``>`` ...) as words of their own."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def tuner_argv(command: str) -> list[str] | None:
    """The arguments of the `tuner` command in a shell line (after any VAR=value, up to a shell operator), or None
    when the line runs no `tuner`. A literal ``...`` (the docs' "and the rest of your flags") is left out."""
    words = tokens(command)
    if "tuner" not in words:
        return None
    after = words[words.index("tuner") + 1 :]
    end = next((i for i, w in enumerate(after) if w in SHELL_OPERATORS), len(after))
    return [w for w in after[:end] if w != "..."]


def _root() -> Any:
    import typer

    from tuner.cli.app import _register, app

    _register()
    return typer.main.get_command(app)


def command_of(argv: list[str]) -> tuple[Any, Any]:
    """Parses ``tuner ARGV`` with the real command line, as it would before running: the click command it names and
    its parsed context. Raises click's UsageError / BadParameter (an unknown option, a bad value, a missing one)."""
    group = _root()
    ctx = group.make_context("tuner", list(argv))
    cmd, args = group, [*ctx._protected_args, *ctx.args]
    while hasattr(cmd, "resolve_command"):
        name, sub, args = cmd.resolve_command(ctx, args)
        ctx = sub.make_context(name, args, parent=ctx)
        cmd, args = sub, [*getattr(ctx, "_protected_args", []), *ctx.args]
    return cmd, ctx


def with_options(command: str, options: list[tuple[str, str]]) -> str:
    """``command`` with each option set to its value: replaced where the command has it, added to a `tuner search`
    that takes it (what bounds a search on a CPU runner: its budget, its trials, its device). A plain command (no
    pipe, redirection or substitution) is required: it is re-quoted."""
    words = tokens(command)
    assert not SHELL_OPERATORS & set(words), f"a `run with` command must be a plain command: {command}"
    argv = tuner_argv(command)
    takes: set[str] = set()
    if argv is not None and argv[:1] == ["search"]:
        cmd, _ = command_of(argv)
        takes = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    for option, value in options:
        if option in words:
            words[words.index(option) + 1] = value
        elif option in takes:
            words += [option, value]
    return shlex.join(words)
