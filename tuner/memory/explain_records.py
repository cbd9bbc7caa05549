"""The typed records of an explanation (tuner.memory.explain computes them, tuner.cli.explain_view prints them): a
change that fits, a measured phase against the estimate's, a probed trial's recorded failure and facts, and the
explanation itself."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trials.contract import FailedAllocation, Knobs
from tuner.job.padding import BatchShape
from tuner.memory.breakdown import (
    EVAL_FORWARD,
    FORWARD_BACKWARD,
    GENERATE,
    NOT_COVERED,
    OPTIMIZER_STEP,
    PHASE_TITLES,
    Breakdown,
    PhaseEstimate,
    RankEstimate,
)
from tuner.memory.crash import CrashOdds
from tuner.memory.oom_match import Attribution, Match
from tuner.memory.oom_message import OomMessage
from tuner.memory.snapshot_parts import SnapshotRead
from tuner.units import memory_text


@dataclass(frozen=True)
class Change:
    """One change that makes the worst batch fit: what it is, its predicted peak, the throughput relative to
    today's config as far as the estimate can say (``speed``) and why (``basis``), and the search that probes it."""

    what: str
    peak: int
    speed: float
    basis: str
    flags: str = ""  # added to the job's `tuner search` command
    space: str | None = None  # a space file's YAML (one line) the search probes the change with
    changes_job: bool = False  # truncation changes what the model trains on

    def line(self) -> str:
        return f"{self.what}: peak {memory_text(self.peak)}, throughput ~{self.speed:.2f}x ({self.basis})"


#: a probe's measured phases (trials.contract.MEMORY_PHASES) -> the estimate's phases whose peak it measures
MEASURED_AS = {
    "train": (FORWARD_BACKWARD, OPTIMIZER_STEP),
    "eval_forward": (EVAL_FORWARD,),
    "generate": (GENERATE,),
}
MEASURED_TITLES = {"train": "train step", "eval_forward": PHASE_TITLES[EVAL_FORWARD], "generate": "generate"}


@dataclass(frozen=True)
class PhaseCheck:
    """A measured phase's peak (the most over the ranks; allocated bytes) against the estimate's for it: the
    largest of the estimate's phases it spans (the train step: forward + backward and the optimizer step),
    uncalibrated, part by part (``estimate``)."""

    phase: str  # trials.contract.MEMORY_PHASES
    measured: int
    estimate: PhaseEstimate

    @property
    def error(self) -> float:
        return self.estimate.total / self.measured - 1 if self.measured else 0.0

    def describe(self) -> str:
        return (
            f"{MEASURED_TITLES.get(self.phase, self.phase)}: measured {memory_text(self.measured)}, estimated "
            f"{memory_text(self.estimate.total)} ({self.estimate.title}, {self.error:+.1%})"
        )


@dataclass(frozen=True)
class RecordedFailure:
    """A rank's recorded out-of-memory (trials.contract.FailedAllocation) attributed to the estimate's parts, and the
    CUDA memory snapshot the rank wrote (a path; None on the emulated device or where none was kept) and what
    reading it gave (its live bytes per estimate part, tuner.memory.snapshot_parts; else why it was not read)."""

    rank: int
    failed: FailedAllocation
    attribution: Attribution
    snapshot: str | None = None
    snapshot_read: SnapshotRead | None = None


@dataclass(frozen=True)
class TrialFacts:
    """What a study's trial measured, against the estimate: its status and cause, the measured phases, the most a
    rank needed (``need``; after an OOM the in-use + refused lower bound, ``oom_need``), the estimate's peak
    calibrated on ``calibration_probes`` other measured probes of the study, and each rank's recorded failure."""

    study: str
    trial: int
    status: str
    cause: str | None
    checks: tuple[PhaseCheck, ...]
    need: int | None
    oom_need: int | None
    calibrated: int
    raw: int
    calibration_probes: int
    failures: tuple[RecordedFailure, ...] = ()
    snapshots: tuple[str, ...] = ()


@dataclass(frozen=True)
class MeasuredTrial:
    """The stored facts of a trial that the explanation reads (tuner.records.measurement, typed by the caller)."""

    study: str
    trial: int
    status: str
    cause: str | None
    phases: Mapping[str, int]
    need: int | None
    oom_need: int | None
    failures: tuple[tuple[int, FailedAllocation, str | None], ...] = ()  # (rank, failed allocation, snapshot path)
    snapshots: tuple[str, ...] = ()
    snapshot_reads: tuple[SnapshotRead, ...] = ()  # the failures' snapshot files read (the caller reads them)


@dataclass(frozen=True)
class Explanation:
    config: Knobs
    capacity: int
    margin: float
    worst: BatchShape
    breakdown: Breakdown
    verdict: str
    crossing: str | None  # the first phase that crosses (None: the worst batch fits)
    eval_note: str | None
    crash: CrashOdds | None
    oom: OomMessage | None
    matches: tuple[Match, ...]
    fragmentation: str | None
    changes: tuple[Change, ...]
    not_covered: str = NOT_COVERED
    traced_lengths: tuple[int, ...] = ()
    trial: TrialFacts | None = None  # `tuner explain --study S --trial N`: what the trial measured
    with_data: bool = False  # the worst batch is the data's (--dataset given), not every sample at max_length


def phase_checks(rank: RankEstimate, measured: Mapping[str, int]) -> tuple[PhaseCheck, ...]:
    """Each measured phase against the estimate's phase it measures (the largest of those it spans)."""
    out = []
    phases = {p.phase: p for p in rank.phases}
    for name, peak in measured.items():
        spans = [phases[p] for p in MEASURED_AS.get(name, ()) if p in phases]
        if spans and peak > 0:
            out.append(PhaseCheck(name, peak, max(spans, key=lambda p: p.total)))
    return tuple(out)
