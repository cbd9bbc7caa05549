"""The crash line: with the user's data and a config, the share of its batches the config cannot hold and when a
shuffled run meets the first (tuner.memory.crash), from the estimate at each batch's padded input length. One
function, ``crash_line``, read by the dry run (tuner.session.plan), `tuner estimate` (the data as read), and, from
the study's stored data summary (tuner.job.length_summary) and the estimate calibrated on the study's measured
probes (``StudyCrash``), by `tuner trials`, `tuner best --changes` and the report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from tuner.errors import TunerError

if TYPE_CHECKING:
    from trials.contract import Knobs
    from tuner.job.data_job import DataJob
    from tuner.job.definition import Job
    from tuner.job.length_summary import LengthSummary
    from tuner.memory.crash import CrashOdds
    from tuner.memory.estimator import Estimator
    from tuner.memory.trace import Trace
    from tuner.records import ProbeRow, StudyDefinition
    from tuner.storage import Store


def crash_odds_of(
    data: DataJob | LengthSummary, job: Job, config: Knobs, world_size: int, capacity: int, estimator: Estimator
) -> CrashOdds:
    """The odds (tuner.memory.crash) of ``config`` on ``data``: the lengths as read, or a study's stored summary.
    TunerError when the estimate has no traced point for the config's checkpointing/precision."""
    from tuner.job.data_job import DataJob
    from tuner.job.padding import BatchShape, Collation
    from tuner.memory.crash import crash_odds

    @cache
    def peak(batch: int, length: int) -> float:
        knobs = config.model_copy(update={"micro_batch_size": batch, "max_length": length})
        return float(estimator.predict(knobs).calibrated)

    def need(shape: BatchShape) -> float:
        return peak(shape.batch, shape.input_length)

    if isinstance(data, DataJob):
        lengths, counts, collation = data.lengths, None, data.collation(job.max_length, job.max_target_length)
    else:
        (lengths, counts), collation = data.cells(), Collation(data.padding, job.max_length, job.max_target_length)
    return crash_odds(lengths, config.micro_batch_size, world_size, collation, need, capacity, counts)


def crash_line(
    data: DataJob | LengthSummary,
    job: Job,
    config: Knobs,
    world_size: int,
    capacity: int,
    estimator: Estimator,
    whose: str,
) -> str:
    """``whose`` names the config ("your config", "this config", "trial 3")."""
    try:
        odds = crash_odds_of(data, job, config, world_size, capacity, estimator)
    except TunerError as err:  # no traced point for the config's checkpointing/precision
        return f"{whose} on your data: no crash estimate ({err})"
    return f"{whose} on your data: {odds.describe()} [{_sources(data, job, estimator)}]"


def _sources(data: DataJob | LengthSummary, job: Job, estimator: Estimator) -> str:
    """Which lengths the estimate traced, which the probes measured, which are extrapolated; a summary's rounding."""
    from tuner.job.data_job import DataJob

    traced = sorted({p.max_length for p in estimator.trace.points})
    measured = sorted({int(k.get("max_length") or 0) for k, _ in estimator.observations} - {0})
    probes = len(estimator.observations)
    calibrated = (
        f"; calibrated on {probes} measured probe{'s' if probes != 1 else ''} at {_tokens(measured)} tokens (exact "
        "there)"
        if probes
        else ""
    )
    rounding = "" if isinstance(data, DataJob) else f"; stored data: {data.rounding.describe()}"
    return (
        f"the estimate traced inputs of {_tokens(traced)} tokens, labels at {job.max_target_length or job.max_length}"
        f"{calibrated}; other input lengths follow its a*L + b*L^2 fit, extrapolated beyond the traced ones{rounding}"
    )


def _tokens(lengths: list[int]) -> str:
    return ", ".join(f"{n:,}" for n in lengths)


# -- from a stored study ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StudyCrash:
    """What the crash line of a stored study reads: its data summary, its job, and the estimate from its stored trace
    calibrated on its measured probes, against the device memory (``capacity``: the OOM is at capacity)."""

    summary: LengthSummary
    job: Job
    estimator: Estimator
    world_size: int
    capacity: int

    def odds(self, knobs: Mapping[str, Any]) -> CrashOdds | None:
        """None when the estimate cannot say (no traced point for the config's checkpointing/precision)."""
        try:
            return crash_odds_of(self.summary, self.job, _knobs(knobs), self.world_size, self.capacity, self.estimator)
        except (TunerError, ValueError):
            return None

    def line(self, knobs: Mapping[str, Any], whose: str) -> str:
        try:
            config = _knobs(knobs)
        except ValueError:  # a row stored by an older version, or by hand: no config the estimate reads
            return f"{whose} on your data: no crash estimate (its stored knobs are not a config this tuner reads)"
        return crash_line(self.summary, self.job, config, self.world_size, self.capacity, self.estimator, whose)

    def shown(self, knobs: Mapping[str, Any], whose: str, always: bool = False) -> str | None:
        """The line for a config that fits typical batches but not the worst (``always``: for any config)."""
        odds = self.odds(knobs)
        if always or (odds is not None and 0 < odds.unfit_share < 1):
            return self.line(knobs, whose)
        return None


def _knobs(knobs: Mapping[str, Any]) -> Knobs:
    from trials.contract import Knobs

    return knobs if isinstance(knobs, Knobs) else Knobs.model_validate(dict(knobs))


def study_crash(definition: StudyDefinition, rows: Iterable[ProbeRow]) -> StudyCrash | None:
    """The crash line's inputs for a stored study, or None when it has no stored data, trace, job or device memory
    (a study without --dataset, or from before the summary was stored)."""
    from tuner.job.definition import Job
    from tuner.job.length_summary import LengthSummary, SummaryError
    from tuner.memory.estimator import Estimator
    from tuner.memory.trace import Trace

    d = definition
    rows = list(rows)
    capacity = d.device_memory or max((int(r.capacity) for r in rows if r.capacity), default=0)
    if d.data is None or d.trace is None or d.job is None or not capacity or d.world_size is None:
        return None
    try:
        summary = LengthSummary.from_json(d.data)
        trace = Trace.model_validate(d.trace)
        job = Job.model_validate(d.job)
    except (SummaryError, ValueError):
        return None
    estimator = Estimator(trace=trace, world_size=d.world_size, global_batch=d.global_batch)
    calibrate(estimator, rows)
    return StudyCrash(summary, job, estimator, d.world_size, capacity)


def calibrate(estimator: Estimator, rows: Iterable[ProbeRow]) -> None:
    """Observes each config's first measured ok peak, as the search's evidence does (tuner.search.evidence)."""
    from tuner.records import ProbeStatus

    seen: set[str] = set()
    for row in rows:
        if not row.measured or row.config_key in seen or row.status != ProbeStatus.OK:
            continue
        seen.add(row.config_key)
        need = row.memory_need
        if need:
            before = len(estimator.observations)
            try:
                estimator.observe(row.knobs, int(need))
            except (TunerError, ValueError):  # a config the trace has no point for: not calibrated on
                del estimator.observations[before:]


def keep_trace(store: Store, study: str, trace: Trace) -> None:
    """Records the estimate's trace with a study that stores data (first worker wins), so that `tuner trials`, `best`
    and the report can rebuild the estimate; the largest allocations are left out (the explain view's, not needed)."""
    definition = store.definition(study)
    if definition is None or definition.data is None or definition.trace is not None:
        return
    points = [p.model_copy(update={"largest": {}}) for p in trace.points]
    store.record_in_definition(study, "trace", trace.model_copy(update={"points": points}).model_dump(mode="json"))


def pick_lines(crash: StudyCrash | None, pick: Mapping[str, Any] | None, baseline: ProbeRow | None) -> list[str]:
    """What `tuner best --changes` and the report say of the data: where it came from, the baseline's crash line,
    then the pick's (that it fits the worst batch, with its need, or when it would crash)."""
    if crash is None:
        return []
    out = [f"your data: {crash.summary.origin.describe(crash.summary.samples)}"]
    if baseline is not None and baseline.knobs:
        which = f" (trial {baseline.trial_number})" if baseline.trial_number is not None else ""
        out.append(crash.line(baseline.knobs, f"your config{which}"))
    if pick is not None:
        out.append(crash.line(pick, "the pick"))
    return out


__all__ = ["StudyCrash", "calibrate", "crash_line", "crash_odds_of", "keep_trace", "pick_lines", "study_crash"]
