"""The live progress display of `tuner search` (rich) and its final summary table."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from tuner.job.objective import Objective
from tuner.records import Candidate, Fidelity, ProbeOutcome, ProbeRow, ProbeStatus, ProposedProbe
from tuner.records.probe import refusal_reason
from tuner.records.throughput import Throughput, config_throughput, number, speedup_text, throughput
from tuner.reporting.labels import compact
from tuner.session.driver import SearchSummary
from tuner.units import Deadline, format_duration, format_size

RECENT = 8


def fmt_num(value: float | None) -> str:
    """A throughput as every face rounds it (tuner.records.throughput.number)."""
    return number(value)


class LiveProgress:
    """A Listener for tuner.session.driver that renders counts, best so far, the running probe and time left."""

    def __init__(
        self,
        console: Console,
        deadline: Deadline,
        objective: Objective,
        study: str,
        job: Mapping[str, Any] | None = None,
        crash: Callable[[Mapping[str, Any]], str | None] | None = None,
    ) -> None:
        self.console = console
        self.job = job  # the job's values (held fixed, printed once above the stream) are left out of each label
        self.crash = crash  # the baseline's crash line on the study's data (tuner.session.crash_line), None: none
        self.trials: dict[str, tuple[int, ProbeStatus]] = {}  # a probed config's label -> its trial and status
        self.cited: set[str] = set()  # the reasons already printed: later configs they rule out are only counted
        self.refusals: set[str] = set()  # the refusal causes already printed whole (under the first refused probe)
        self.held: tuple[ProposedProbe, ProbeRow] | None = None  # the last probe, printed with what it rules out
        self.deadline = deadline
        self.objective = objective
        self.study = study
        self.counts = {"probed": 0, "ok": 0, "stable": 0, "oom": 0, "inferred": 0, "failed": 0, "confirmed": 0}
        self.best: tuple[float, dict[str, Any]] | None = None
        self.current: tuple[ProposedProbe, float] | None = None
        self.recent: list[ProbeRow] = []
        self.pending: list[ProbeRow] = []  # inferred rows not printed yet (grouped by why they were ruled out)
        self.quiet = 0  # configs ruled out for a reason already printed
        self.live = Live(self, console=console, refresh_per_second=2, transient=True)

    def __enter__(self) -> LiveProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._flush()
        self.live.__exit__(*exc)

    # -- Listener ----------------------------------------------------------------------------------------------------
    # A probe's line waits for the configs its result rules out (the strategy's next proposal, a moment later: the
    # driver reports them before it starts the next probe), so the line can say how many; configs ruled out for a
    # reason printed before are counted, not printed again (`tuner trials --all` lists every one).
    def started(self, proposal: ProposedProbe) -> None:
        self._flush()
        self.current = (proposal, time.monotonic())

    def finished(self, proposal: ProposedProbe, outcome: ProbeOutcome) -> None:
        self._flush()
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
        if proposal.trial_number is not None:
            self.trials[compact(row.knobs, self.job)] = (proposal.trial_number, status)
        self.held = (proposal, row)

    def inferred(self, row: ProbeRow) -> None:
        """Configs ruled out without running: counted on the line of the probe that rules them out, or one line per
        reason (printed before the next probe starts)."""
        self.counts["inferred"] += 1
        self.pending.append(row)

    def note(self, message: str) -> None:
        self._flush()
        self.console.print(Text(message))  # the search's notes quote stored and storage text: never markup

    def _flush(self) -> None:
        rows, self.pending = self.pending, []
        if self.held is not None:
            proposal, row = self.held
            self.held = None
            label = compact(row.knobs, self.job)
            own = [r for r in rows if cause_label(r, self.job) == label]
            rows = [r for r in rows if r not in own]
            refusal = refusal_reason(row.cause) if row.status == ProbeStatus.REFUSED else ""
            said = refusal in self.refusals
            line = probe_line(proposal.trial_number, proposal.fidelity, row, self.objective.unit, self.job, said)
            if own:
                self.cited.add(_reason(own[0], self.job, self.trials))
            self.console.print(line + (f"  [dim](rules out {len(own)})[/]" if own else ""))
            if refusal and not said:  # the only answer to why it never ran, with its fix: whole, once
                self.refusals.add(refusal)
                self.console.print(Text(f"  \u21b3 {refusal}"))
            crash = self.crash(row.knobs) if self.crash is not None and proposal.fidelity == Fidelity.BASELINE else None
            if crash:
                self.console.print(Text(f"  {crash}"))  # quotes stored text: never markup
        fresh = [r for r in rows if _reason(r, self.job, self.trials) not in self.cited]
        self.quiet += len(rows) - len(fresh)
        for line in ruled_out_lines(fresh, self.job, self.trials):
            self.console.print(Text(line, style="dim"))
        self.cited.update(_reason(r, self.job, self.trials) for r in fresh)

    # -- rendering ---------------------------------------------------------------------------------------------------
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
            Text(f"best so far: {fmt_num(self.best[0])} {self.objective.unit}  {compact(self.best[1], self.job)}")
            if self.best
            else Text("best so far: -")
        )
        parts: list[Any] = [head, best]
        if self.current is not None:
            p, since = self.current
            parts.append(
                Text(
                    f"probing ({p.fidelity}, {time.monotonic() - since:.0f}s of at most {p.config.timeout_s:.0f}s): "
                    f"{compact(p.config.knobs.model_dump(), self.job)} accum={p.config.gradient_accumulation_steps}",
                    style="bold",
                )
            )
        return Panel(Group(*parts), title=Text(f"tuner search: {self.study}"), border_style="blue")


def probe_line(
    number: int | None,
    fidelity: str,
    row: ProbeRow,
    unit: str,
    job: Mapping[str, Any] | None,
    said: bool = False,
) -> str:
    """One probe's line of the live stream, within 100 columns for most configs: trial (or "confirm"), status, the
    throughput or a brief cause (`tuner trials` shows the whole), peak, seconds, the config without the job's values.
    A refusal's reason is never cut: the stream prints it whole under the line ("reason below"), or under an earlier
    one (``said``: "as above"). Stored text (cause, knobs) is escaped so rich never reads it as markup."""
    head = f"trial {number:>3}" if number is not None else f"{fidelity:<9}"
    status = row.status.value + ("" if row.status != ProbeStatus.OK or row.stable else " unstable")
    colour = {ProbeStatus.OK: "green", ProbeStatus.OOM: "yellow"}.get(row.status, "red")
    value = f"{fmt_num(row.objective)} {unit}" if row.objective is not None else brief_cause(row.status, row.cause)
    if row.status == ProbeStatus.REFUSED:
        value = "as above" if said else "reason below"
    label = compact(row.knobs, job) + ("" if fidelity in ("short", "confirm") else f" ({fidelity})")
    return (
        f"{head}  [{colour}]{status:<11}[/]  {escape(f'{value:<17}')}  peak {format_size(row.peak_allocated):>9}  "
        f"{row.probe_seconds or 0:5.1f}s  {escape(label)}"
    )


_ALLOC = re.compile(r"tried to allocate ([\d.]+ ?[KMGT]i?B)", re.IGNORECASE)


def brief_cause(status: ProbeStatus, cause: str | None, width: int = 17) -> str:
    """A failed probe's cause in ``width`` characters: an OOM's failed allocation (torch's and the emulated device's
    message both say "tried to allocate X"), else the cause's first line, cut with an ellipsis."""
    text = (cause or "").strip()
    found = _ALLOC.search(text)
    if status == ProbeStatus.OOM:
        return f"alloc {found.group(1)}" if found else "out of memory"
    first = text.splitlines()[0] if text else status.value
    return first if len(first) <= width else first[: width - 1] + "\u2026"


def cause_label(row: ProbeRow, job: Mapping[str, Any] | None) -> str | None:
    """The label of the measured config that rules an inferred row out (None: another reason, e.g. the estimate)."""
    ruled = row.ruled_out_by
    return compact(ruled.measured, job) if ruled is not None and ruled.measured is not None else None


def _reason(row: ProbeRow, job: Mapping[str, Any] | None, trials: Mapping[str, tuple[int, ProbeStatus]]) -> str:
    """Why a config was ruled out, as one group (its ``ruled_out_by``): the measured config whose memory it needs at
    least (an OOM, or a peak over the headroom; cited by its trial number when the stream printed it), or the
    estimate."""
    label = cause_label(row, job)
    if label is not None:
        if label in trials:
            number, status = trials[label]
            what = "an OOM" if status.out_of_memory else "over the headroom"
            return f"each needs at least trial {number}'s memory ({what})"
        return f"each needs at least the memory of {label}, which did not fit"
    ruled = row.ruled_out_by
    if ruled is not None and ruled.estimate_bytes is not None:
        return "the memory estimate puts each far over the device memory"
    return (ruled.stated if ruled is not None else None) or row.cause or "inferred-oom"


def ruled_out_lines(
    rows: Sequence[ProbeRow],
    job: Mapping[str, Any] | None = None,
    trials: Mapping[str, tuple[int, ProbeStatus]] | None = None,
) -> list[str]:
    """The inferred rows of one decision (between two probes), one line per reason: how many configs, their micro
    batch span, why (`tuner trials --all` lists each with its own cause)."""
    groups: dict[str, list[ProbeRow]] = {}
    for row in rows:
        groups.setdefault(_reason(row, job, trials or {}), []).append(row)
    lines = []
    for why, group in groups.items():
        micros = sorted({int(r.knobs.get("micro_batch_size") or 0) for r in group})
        span = f"micro {micros[0]}" + (f"-{micros[-1]}" if len(micros) > 1 else "")
        n = len(group)
        lines.append(f"ruled out {n} config{'s' if n > 1 else ''} ({span}) without running: {why}")
    return lines


def summary_table(summary: SearchSummary, objective: Objective, job: Mapping[str, Any] | None = None) -> Group:
    """The end of a search in a few lines: what ran, the user's config's verdict, the pick and its speed-up, and
    the next command. Every value is printed as text (stored strings are never markup)."""
    c = summary.counts
    inferred = c.get("inferred-oom", 0)
    lines = [
        f"study {summary.study_name}: {summary.stop_reason} after {format_duration(summary.elapsed_s)}",
        f"{summary.probes_run} probes in {summary.probe_seconds:.0f} probe-seconds: {c.get('ok', 0)} ok, "
        f"{c.get('oom', 0)} OOM, {c.get('timeout', 0)} timed out, {c.get('error', 0)} failed"
        + (f", {c['refused']} refused before running (each row says why)" if c.get("refused") else "")
        + f"; {inferred} ruled out without running",
    ]
    best, base = summary.best, summary.baseline
    pick = throughput(best.rows) if best is not None else None
    mine = summary.baseline_throughput or config_throughput([], base)
    if base is not None:
        lines.append(_yours(base, mine, pick, objective.unit))
    if best is not None and pick is not None:
        lines.append(
            f"the pick: trial {best.trial_number}, {compact(best.knobs, job)} "
            f"accum={best.config.get('gradient_accumulation_steps')}, peak {format_size(best.peak_allocated)} of "
            f"{format_size(best.capacity)}"
        )
        lines.append(f"  {pick.text(objective.unit)}{_evidence(best, pick)}")
        formats = "accelerate|hf|env" if best.knobs.get("engine") == "fsdp2" else "deepspeed|hf|accelerate|env"
        lines.append(f"next: tuner best --study {summary.study_name} --changes")
        lines.append(f"then: tuner export --study {summary.study_name} --format {formats} -o FILE")
    else:
        lines.append("the pick: no stable config yet")
    return Group(*(Text(line) for line in lines))


def _yours(base: ProbeRow, mine: Throughput | None, pick: Throughput | None, unit: str) -> str:
    """The user's config beside the pick: the speed-up (the ratio of the two figures printed), its own figure without
    a pick, or how its probe failed."""
    if mine is not None and pick is not None:
        return speedup_text(pick, mine, unit)
    if mine is not None:
        return f"your config: {mine.text(unit)} ({mine.statistic()})"
    return f"your config: {base.status.value}: {base.cause or ''} (peak {format_size(base.peak_allocated)})"


def _evidence(best: Candidate, pick: Throughput) -> str:
    """What the pick's figure is (the statistic every face shows: tuner.records.throughput), confirmed or not, and
    with several probes of it, each measurement."""
    measured = [fmt_num(r.objective) for r in best.rows if r.objective is not None]
    confirmed = "confirmed" if best.confirmed else "not confirmed"
    if len(measured) < 2:
        return f" ({pick.statistic()}; {confirmed})"
    return f" ({pick.statistic()}: {', '.join(measured)}; {confirmed})"
