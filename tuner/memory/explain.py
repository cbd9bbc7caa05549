"""Why a config runs out of memory, from the one shared estimate (pure): the phases and parts of its worst batch,
the verdict (the first phase, in the order a run meets them, that crosses the device memory), the user's OOM
message matched to a traced allocation, and the smallest changes that fit, ranked by predicted throughput.

`tuner explain` (tuner.cli.explain) builds the inputs from the job as `tuner search` reads it and prints the
record; every number here comes from :class:`tuner.memory.estimator.Estimator`.
"""

from __future__ import annotations

from dataclasses import replace

from trials.contract import Knobs
from tuner.errors import TunerError
from tuner.job.padding import BatchShape, worst_batch
from tuner.memory.breakdown import (
    EVAL_FORWARD,
    FORWARD_BACKWARD,
    GENERATE,
    OPTIMIZER_STEP,
    Breakdown,
    PhaseEstimate,
)
from tuner.memory.crash import CrashOdds, crash_odds
from tuner.memory.explain_changes import (  # noqa: F401  (re-exported: Inputs and the changes)
    CHECKPOINTING_SPEED,
    Inputs,
    at,
    changes,
)
from tuner.memory.explain_records import (  # noqa: F401  (re-exported: the records of an explanation)
    Change,
    Explanation,
    MeasuredTrial,
    PhaseCheck,
    RecordedFailure,
    TrialFacts,
    phase_checks,
)
from tuner.memory.oom_match import Match, attribute, match_failed
from tuner.memory.oom_message import OomMessage, fragmentation
from tuner.memory.precision import traced_precision
from tuner.units import memory_text

#: the order a training run meets its phases: the train step's before any evaluation
RUN_ORDER = (FORWARD_BACKWARD, OPTIMIZER_STEP, EVAL_FORWARD, GENERATE)


def _at(k: Knobs, shape: BatchShape) -> Knobs:
    return at(k, shape)


def _worst(i: Inputs) -> BatchShape:
    if i.lengths is None or i.collation is None:
        return BatchShape(i.config.micro_batch_size, i.config.max_length)
    return worst_batch(i.lengths, i.config.micro_batch_size, i.collation)


def _crossing(b: Breakdown, limit: int) -> PhaseEstimate | None:
    phases = {p.phase: p for p in b.worst.phases}
    return next((phases[n] for n in RUN_ORDER if n in phases and phases[n].total > limit), None)


def _verdict(i: Inputs, worst: BatchShape, b: Breakdown, first: PhaseEstimate | None) -> str:
    if first is None:
        return f"the worst batch ({worst.describe()}) fits: peak {memory_text(b.peak)} of {memory_text(i.capacity)}"
    part = max(first.parts, key=lambda p: p.nbytes)
    rank = "every rank alike (data parallel)" if b.worst.rank is None else f"rank {b.worst.rank}"
    return (
        f"the {first.title} at the worst batch ({worst.describe()}) crosses the device memory: "
        f"{memory_text(first.total)} > {memory_text(i.capacity)}, mostly {part.name} "
        f"({memory_text(part.nbytes)}); {rank}"
    )


def _eval_note(i: Inputs, b: Breakdown, first: PhaseEstimate | None, limit: int) -> str | None:
    over = [p for p in b.worst.phases if p.phase in (EVAL_FORWARD, GENERATE) and p.total > limit]
    if not over:
        return None
    when = i.eval_when or "when evaluation first runs (not stated)"
    lead = "it would cross too" if first is not None and first.phase not in (EVAL_FORWARD, GENERATE) else "it crosses"
    names = ", ".join(f"{p.title} {memory_text(p.total)}" for p in over)
    return f"evaluation: {names} at the longest eval batch; {lead}, but only {when}"


def explain(i: Inputs, oom: OomMessage | None = None) -> Explanation:
    est, k = i.estimator, i.config
    worst = _worst(i)
    b = est.breakdown(_at(k, worst))
    limit = i.capacity
    first = _crossing(b, limit)
    crash = _crash(i)
    matches: tuple[Match, ...] = ()
    frag = None
    if oom is not None:
        batches = {FORWARD_BACKWARD: worst.batch, OPTIMIZER_STEP: worst.batch}
        if k.eval_batch_size:
            batches |= {EVAL_FORWARD: k.eval_batch_size, GENERATE: k.eval_batch_size}
        longest = worst.input_length
        cast = traced_precision(k).cast_module
        matches = tuple(
            match_failed(est.trace, oom.failed, batches, longest, k.gradient_checkpointing, k.precision, cast)
        )
        frag = fragmentation(oom)[1]
    return Explanation(
        config=k,
        capacity=i.capacity,
        margin=i.margin,
        worst=worst,
        breakdown=b,
        verdict=_verdict(i, worst, b, first),
        crossing=first.phase if first is not None else None,
        eval_note=_eval_note(i, b, first, limit),
        crash=crash,
        oom=oom,
        matches=matches,
        fragmentation=frag,
        changes=tuple(changes(i, worst)) if first is not None else (),
        traced_lengths=i.traced_lengths,
        with_data=i.lengths is not None,
    )


def _crash(i: Inputs) -> CrashOdds | None:
    if i.lengths is None or i.collation is None:
        return None
    est, k = i.estimator, i.config

    def need(shape: BatchShape) -> float:
        return float(est.predict(_at(k, shape)).calibrated)

    try:
        return crash_odds(i.lengths, k.micro_batch_size, i.world_size, i.collation, need, i.capacity)
    except TunerError:
        return None


def explain_trial(i: Inputs, m: MeasuredTrial) -> Explanation:
    """The explanation of a probed trial: the job form's (:func:`explain`, the estimate at the trial's config as
    probed: every batch at its max_length) with what the trial measured set against it, phase by phase, and each
    rank's recorded failure attributed to the estimate's parts (tuner.memory.oom_match.attribute)."""
    found = explain(i)
    est = i.estimator
    predicted = est.predict(i.config)
    reads = {r.path: r for r in m.snapshot_reads}
    failures = tuple(
        RecordedFailure(
            rank, failed, attribute(failed, i.config, est.trace, found.breakdown), snapshot, reads.get(snapshot or "")
        )
        for rank, failed, snapshot in m.failures
    )
    facts = TrialFacts(
        study=m.study,
        trial=m.trial,
        status=m.status,
        cause=m.cause,
        checks=phase_checks(found.breakdown.worst, m.phases),
        need=m.need,
        oom_need=m.oom_need,
        calibrated=predicted.calibrated,
        raw=predicted.raw,
        calibration_probes=len(est.observations),
        failures=failures,
        snapshots=m.snapshots,
    )
    return replace(found, trial=facts)
