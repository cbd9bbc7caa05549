"""The live progress display of `tuner search` (rich) and its final summary table."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from tuner.job.objective import Objective
from tuner.memory.frontier import describe
from tuner.search.driver import SearchSummary
from tuner.search.rows import ProbeRow, ProbeStatus
from tuner.search.strategy import Outcome, Proposal
from tuner.units import Deadline, format_duration, format_size

RECENT = 8


def knob_label(knobs: dict[str, Any]) -> str:
    return describe(knobs)


def fmt_num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


class LiveProgress:
    """A Listener for tuner.search.driver that renders counts, best so far, the running probe and time left."""

    def __init__(self, console: Console, deadline: Deadline, objective: Objective, study: str) -> None:
        self.console = console
        self.deadline = deadline
        self.objective = objective
        self.study = study
        self.counts = {"probed": 0, "ok": 0, "stable": 0, "oom": 0, "inferred": 0, "failed": 0, "confirmed": 0}
        self.best: tuple[float, dict[str, Any]] | None = None
        self.current: tuple[Proposal, float] | None = None
        self.recent: list[ProbeRow] = []
        self.live = Live(self, console=console, refresh_per_second=2, transient=True)

    def __enter__(self) -> LiveProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.__exit__(*exc)

    # -- Listener ----------------------------------------------------------------------------------------------------
    def started(self, proposal: Proposal) -> None:
        self.current = (proposal, time.monotonic())

    def finished(self, proposal: Proposal, outcome: Outcome) -> None:
        self.current = None
        row = outcome.row
        self.counts["probed"] += 1
        status = row.status
        if status == ProbeStatus.OK:
            self.counts["ok"] += 1
            self.counts["stable"] += int(row.stable)
        elif status == ProbeStatus.OOM:
            self.counts["oom"] += 1
        else:
            self.counts["failed"] += 1
        if proposal.fidelity == "confirm":
            self.counts["confirmed"] += 1
        if row.stable and row.objective is not None and (self.best is None or row.objective > self.best[0]):
            self.best = (row.objective, row.knobs)
        self.recent = ([row, *self.recent])[:RECENT]
        self.console.print(self._line(proposal, row))

    def inferred(self, row: ProbeRow) -> None:
        self.counts["inferred"] += 1
        self.console.print(f"[dim]trial {row.trial_number:>3}  inferred-oom  {escape(knob_label(row.knobs))}[/]")

    def note(self, message: str) -> None:
        self.console.print(Text(message))  # the search's notes quote stored and storage text: never markup

    # -- rendering ---------------------------------------------------------------------------------------------------
    def _line(self, proposal: Proposal, row: ProbeRow) -> str:
        """One probe's line; the cause and the knobs are stored text, escaped so rich never reads them as markup."""
        number = "  -" if proposal.trial_number is None else f"{proposal.trial_number:>3}"
        status = row.status.value + ("" if row.status != ProbeStatus.OK or row.stable else " (unstable)")
        colour = {ProbeStatus.OK: "green", ProbeStatus.OOM: "yellow"}.get(row.status, "red")
        value = f"{fmt_num(row.objective)} {self.objective.unit}" if row.objective is not None else row.cause or ""
        return (
            f"trial {number}  {proposal.fidelity:<8} [{colour}]{status:<16}[/] {escape(f'{value:<28}')} "
            f"peak {format_size(row.peak_allocated)}  {row.probe_seconds or 0:.1f}s  "
            f"{escape(knob_label(row.knobs))}"
        )

    def __rich__(self) -> Panel:
        c = self.counts
        head = Text.assemble(
            ("time left ", "bold"),
            format_duration(self.deadline.left),
            "   probed ",
            str(c["probed"]),
            "   stable ",
            (str(c["stable"]), "green"),
            "   OOM-pruned ",
            (str(c["oom"]), "yellow"),
            "   inferred ",
            (str(c["inferred"]), "cyan"),
            "   failed ",
            (str(c["failed"]), "red"),
            "   confirmed ",
            str(c["confirmed"]),
        )
        best = (
            Text(f"best so far: {fmt_num(self.best[0])} {self.objective.unit}  {knob_label(self.best[1])}")
            if self.best
            else Text("best so far: -")
        )
        parts: list[Any] = [head, best]
        if self.current is not None:
            p, since = self.current
            parts.append(
                Text(
                    f"probing ({p.fidelity}, {time.monotonic() - since:.0f}s of at most {p.config.timeout_s:.0f}s): "
                    f"{knob_label(p.config.knobs.model_dump())} accum={p.config.gradient_accumulation_steps}",
                    style="bold",
                )
            )
        return Panel(Group(*parts), title=Text(f"tuner search: {self.study}"), border_style="blue")


def summary_table(summary: SearchSummary, objective: Objective) -> Table:
    table = Table(
        title=Text(f"study {summary.study_name}: {summary.stop_reason} after {format_duration(summary.elapsed_s)}")
    )
    table.add_column("what")
    table.add_column("value", overflow="fold")
    c = summary.counts
    table.add_row("probes run (this worker)", f"{summary.probes_run} ({summary.probe_seconds:.0f} probe-seconds)")
    table.add_row("trials in study", str(summary.trials))
    table.add_row("ok / oom / inferred-oom", f"{c.get('ok', 0)} / {c.get('oom', 0)} / {c.get('inferred-oom', 0)}")
    table.add_row("timeout / error", f"{c.get('timeout', 0)} / {c.get('error', 0)}")
    best = summary.best
    if best is not None:
        table.add_row(
            "best", f"{fmt_num(best.objective)} {objective.unit}" + (" (confirmed)" if best.confirmed else "")
        )
        table.add_row(
            "best config", Text(knob_label(best.knobs) + f" accum={best.config.get('gradient_accumulation_steps')}")
        )
        table.add_row("best peak", f"{format_size(best.peak_allocated)} of {format_size(best.capacity)}")
        table.add_row("best trial", str(best.trial_number))
    else:
        table.add_row("best", "no stable config yet")
    base = summary.baseline
    if base is not None:
        if base.objective and best is not None:
            table.add_row(
                "baseline",
                f"{fmt_num(base.objective)} {objective.unit}; best is x{best.objective / base.objective:.2f}",
            )
        else:
            table.add_row(
                "baseline",
                Text(f"{base.status.value}: {base.cause or ''} peak {format_size(base.peak_allocated)}"),
            )
    return table
