"""Prints `tuner trials`' listing: the table on a terminal (fitted to its width) or with --wide (every column), tab-
separated lines on a pipe (the study line and the notes then go to stderr, so stdout is one line per row)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import typer
from rich.text import Text

from tuner.cli.listing import PHASE_HEADINGS, Listed, cells, phases_shown
from tuner.cli.safe_console import SafeConsole, safe_text
from tuner.cli.trials_table import Headings, short_unit, table, tsv, wrapped
from tuner.job.definition import Job
from tuner.job.objective import Objective
from tuner.records import StudyDefinition
from tuner.reporting.production import ProductionRun


@dataclass(frozen=True)
class Listing:
    """What `tuner trials` prints of a study: its listed rows (the pick's marked), its production runs, and the crash
    lines' data origin (tuner.session.crash_line), if the study has data."""

    name: str
    definition: StudyDefinition
    listed: Sequence[Listed]
    production: Sequence[tuple[Listed, ProductionRun]]
    data_origin: str | None = None
    empty_note: str | None = None  # said when nothing is listed

    @property
    def unit(self) -> str:
        return Objective.from_dict(self.definition.objective).unit

    def head(self) -> str:
        job = self.definition.job
        held = f"; held fixed, not shown: {Job.model_validate(job).describe()}" if job else ""
        return f"study {self.name} ({self.unit}){held}"

    def notes(self, crash_lines: bool = True) -> list[str]:
        """The lines after the rows: the pick and what its figure is, the empty note, the data's origin and each
        listed config's crash line (not on a pipe: there they are a column)."""
        out = []
        pick = next((r for r in self.listed if r.pick is not None), None)
        if pick is not None and pick.pick is not None:
            out.append(
                f"pick: trial {pick.trial}, {pick.pick.text(self.unit)} ({pick.pick.statistic()}); "
                "`tuner best --changes` lists what it changes"
            )
        if not self.listed and self.empty_note:
            out.append(self.empty_note)
        if self.data_origin is not None:
            out.append(f"your data: {self.data_origin}")
        out += [r.crash for r in self.listed if r.crash] if crash_lines else []
        return out

    def rows(self) -> tuple[Headings, list[Any]]:
        phases = phases_shown(self.listed)
        headings = Headings(short_unit(self.unit), " / ".join(PHASE_HEADINGS[p] for p in phases))
        job = self.definition.job
        rows = [cells(r, job, phases) for r in self.listed]
        for listed, run in self.production:  # a production run's row: its whole line as the cause
            rows.append(replace(cells(listed, job, phases), cause=run.line()))
        return headings, rows


def print_listing(listing: Listing, wide: bool = False) -> None:
    """The listing on stdout: fitted to a terminal, every column with ``wide``, tab-separated on a pipe."""
    out = SafeConsole(highlight=False)
    headings, rows = listing.rows()
    if not wide and not out.is_terminal:
        err = SafeConsole(stderr=True, highlight=False)
        err.print(Text(listing.head()), soft_wrap=True)
        for line in tsv(rows, headings):  # not through rich: it would expand the tabs
            typer.echo(safe_text(line))
        for note in listing.notes(crash_lines=False):
            err.print(Text(note), soft_wrap=True)
        return
    width = None if wide else out.width
    lines = [*wrapped(listing.head(), width), *table(rows, headings, width)]
    lines += [line for note in listing.notes() for line in wrapped(note, width)]
    for line in lines:
        out.print(Text(line), soft_wrap=True)  # stored text ("[stderr: ...]"): never markup


__all__ = ["Listing", "print_listing"]
