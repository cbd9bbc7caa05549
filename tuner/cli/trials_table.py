"""`tuner trials`' table laid out for where it goes: a terminal's width, every column (--wide), or a pipe.

On a terminal the table fits its width: trial, status, throughput, peak and config are kept for every row (the config
wraps within its column); the cause, the per-phase peaks and the seconds are columns while they fit, in that order of
importance, and a cause that does not fit as a column is printed whole under its row ("  ↳ ..."), never cut. --wide
shows every column at its natural width. A pipe gets tab-separated lines, one per row, with a heading line (``tsv``).
Pure: rows of tuner.cli.listing.Cells in, lines out.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.cli.listing import Cells

GAP = 2  # spaces between columns
ORDER = ("trial", "status", "value", "peak", "seconds", "phases", "config", "cause")
REQUIRED = ("trial", "status", "value", "peak", "config")
OPTIONAL = ("cause", "phases", "seconds")  # most important first: the first to come back, the last to go
RIGHT = ("value", "peak", "seconds")
CONFIG_FLOOR = 24  # the config column is never squeezed below this (or its longest label, when shorter)
CAUSE_FLOOR = 30  # a cause column narrower than this reads worse than the cause under its row
BELOW = "  \u21b3 "  # the prefix of a cause printed under its row


@dataclass(frozen=True)
class Headings:
    """The headings: the throughput unit in short ("samples/s", "tokens/s") and the phases' ("train / eval")."""

    value: str = "samples/s"
    phases: str = ""

    def of(self, column: str) -> str:
        named = {"value": self.value, "phases": self.phases, "seconds": "s", "cause": "cause / ranks"}
        named["crash"] = "on your data"
        return named.get(column, column)


def short_unit(unit: str) -> str:
    """The throughput column's heading for an objective unit ("retained tokens/s on drawn batches" -> "tokens/s")."""
    return "tokens/s" if "tokens" in unit else "samples/s"


def _clean(text: str) -> str:
    return " ".join(text.split())


def tsv(rows: Sequence[Cells], headings: Headings) -> list[str]:
    """One heading line, then one tab-separated line per row (no cell holds a tab or a newline): every column that
    has content, nothing cut; with the study's data, each config's crash line as a last column."""
    columns = _present(rows, headings) + (["crash"] if any(r.crash for r in rows) else [])
    lines = ["\t".join(headings.of(c) for c in columns)]
    lines += ["\t".join(_clean(getattr(r, c)) for c in columns) for r in rows]
    return lines


def _present(rows: Sequence[Cells], headings: Headings) -> list[str]:
    """The columns worth showing: the phases only when some row stored them, the cause only when some row has one."""
    out = []
    for c in ORDER:
        if c == "phases" and not headings.phases:
            continue
        if c == "cause" and not any(r.cause for r in rows):
            continue
        out.append(c)
    return out


def _natural(rows: Sequence[Cells], headings: Headings, columns: Sequence[str]) -> dict[str, int]:
    return {c: max([len(headings.of(c))] + [len(getattr(r, c)) for r in rows]) for c in columns}


def _need(columns: Sequence[str], natural: Mapping[str, int]) -> int:
    """The width ``columns`` need with the config and cause at their floors."""
    fixed = sum(natural[c] for c in columns if c not in ("config", "cause"))
    floors = min(natural["config"], CONFIG_FLOOR) + (min(natural["cause"], CAUSE_FLOOR) if "cause" in columns else 0)
    return fixed + floors + GAP * (len(columns) - 1)


def choose(rows: Sequence[Cells], headings: Headings, width: int | None) -> tuple[list[str], dict[str, int]]:
    """The columns shown and their widths: every present column at its natural width without ``width``; else the
    required ones, then each optional one (cause, phases, seconds) that still fits, the config and cause columns
    sharing what is left (the config first, up to its longest label)."""
    present = _present(rows, headings)
    natural = _natural(rows, headings, present)
    if width is None:
        return present, natural
    chosen = [c for c in present if c in REQUIRED]
    for extra in OPTIONAL:
        trial = [c for c in present if c in chosen or c == extra]
        if extra in present and _need(trial, natural) <= width:
            chosen = trial
    widths = {c: natural[c] for c in chosen}
    left = width - sum(widths[c] for c in chosen if c not in ("config", "cause")) - GAP * (len(chosen) - 1)
    cause_floor = min(natural["cause"], CAUSE_FLOOR) if "cause" in chosen else 0
    widths["config"] = max(min(natural["config"], left - cause_floor), min(natural["config"], 12))
    if "cause" in chosen:
        widths["cause"] = max(left - widths["config"], cause_floor)
    return chosen, widths


def _cell_lines(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def _line(parts: Mapping[str, str], columns: Sequence[str], widths: Mapping[str, int]) -> str:
    cells = [parts.get(c, "").rjust(widths[c]) if c in RIGHT else parts.get(c, "").ljust(widths[c]) for c in columns]
    return (" " * GAP).join(cells).rstrip()


def table(rows: Sequence[Cells], headings: Headings, width: int | None) -> list[str]:
    """The table's lines: within ``width`` columns where it is given (a cause that is not a column goes whole under its
    row, wrapped), every column on one line per row without it."""
    columns, widths = choose(rows, headings, width)
    lines = [_line({c: headings.of(c) for c in columns}, columns, widths)]
    below = "cause" not in columns and any(r.cause for r in rows)
    for r in rows:
        wrapped = {c: _cell_lines(getattr(r, c), widths[c]) if width else [getattr(r, c)] for c in columns}
        for i in range(max(len(v) for v in wrapped.values())):
            lines.append(_line({c: v[i] if i < len(v) else "" for c, v in wrapped.items()}, columns, widths))
        if below and r.cause:
            lines += wrap_under(r.cause, width)
    return lines


def wrap_under(text: str, width: int | None) -> list[str]:
    """``text`` under a row, whole: '  ↳ ' then the text wrapped to ``width`` with its continuation lines indented."""
    if width is None:
        return [BELOW + text]
    indent = " " * len(BELOW)
    return textwrap.wrap(
        text, max(width, len(BELOW) + 10), initial_indent=BELOW, subsequent_indent=indent, break_on_hyphens=False
    )


def wrapped(text: str, width: int | None) -> list[str]:
    """A line of text (the study line, a production run, a crash line) within ``width`` (whole without one)."""
    if width is None:
        return [text]
    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False) or [""]


__all__ = ["Headings", "choose", "short_unit", "table", "tsv", "wrap_under", "wrapped"]
