"""Why a config runs out of memory, from the one shared estimate (pure): the phases and parts of its worst batch,
the verdict (the first phase, in the order a run meets them, that crosses the device memory), the user's OOM
message matched to a traced allocation, and the smallest changes that fit, ranked by predicted throughput.

`tuner explain` (tuner.cli.explain) builds the inputs from the job as `tuner search` reads it and prints the
record; every number here comes from :class:`tuner.memory.estimator.Estimator`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trials.contract import Knobs
from tuner.errors import TunerError
from tuner.job.lengths import SampleLengths, cut
from tuner.job.padding import BatchShape, Collation, worst_batch
from tuner.memory.breakdown import (
    EVAL_FORWARD,
    FORWARD_BACKWARD,
    GENERATE,
    OPTIMIZER_STEP,
    Breakdown,
    PhaseEstimate,
)
from tuner.memory.crash import CrashOdds, crash_odds
from tuner.memory.estimator import Estimator
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
from tuner.memory.solve import largest

GiB = 1 << 30
#: the order a training run meets its phases: the train step's before any evaluation
RUN_ORDER = (FORWARD_BACKWARD, OPTIMIZER_STEP, EVAL_FORWARD, GENERATE)
#: compute per sample with gradient checkpointing: the forward runs again in the backward, forward 1 + backward 2
#: becomes 1 + 1 + 2 (4/3 the work), so at most 3/4 the throughput
CHECKPOINTING_SPEED = 0.75


@dataclass(frozen=True)
class Inputs:
    """What an explanation is of: a config of a job on ``world_size`` ranks with ``capacity`` bytes a rank; the
    data's lengths (None: every batch at the config's max_length); ``global_batch`` kept by a smaller micro batch;
    ``eval_when`` when evaluation first runs, in words (from eval_strategy / eval_steps; None: not stated)."""

    estimator: Estimator
    config: Knobs
    capacity: int
    world_size: int
    lengths: SampleLengths | None = None
    collation: Collation | None = None
    global_batch: int | None = None
    eval_when: str | None = None
    margin: float = 0.10
    traced_lengths: tuple[int, ...] = ()  # the input lengths the trace ran at (longer ones extrapolated)


def _at(k: Knobs, shape: BatchShape) -> Knobs:
    return k.model_copy(update={"micro_batch_size": shape.batch, "max_length": shape.input_length})


def _worst(i: Inputs) -> BatchShape:
    if i.lengths is None or i.collation is None:
        return BatchShape(i.config.micro_batch_size, i.config.max_length)
    return worst_batch(i.lengths, i.config.micro_batch_size, i.collation)


def _crossing(b: Breakdown, limit: int) -> PhaseEstimate | None:
    phases = {p.phase: p for p in b.worst.phases}
    return next((phases[n] for n in RUN_ORDER if n in phases and phases[n].total > limit), None)


def _verdict(i: Inputs, worst: BatchShape, b: Breakdown, first: PhaseEstimate | None) -> str:
    if first is None:
        return f"the worst batch ({worst.describe()}) fits: peak {b.peak / GiB:.2f} GiB of {i.capacity / GiB:.2f} GiB"
    part = max(first.parts, key=lambda p: p.nbytes)
    rank = "every rank alike (data parallel)" if b.worst.rank is None else f"rank {b.worst.rank}"
    return (
        f"the {first.title} at the worst batch ({worst.describe()}) crosses the device memory: "
        f"{first.total / GiB:.2f} GiB > {i.capacity / GiB:.2f} GiB, mostly {part.name} "
        f"({part.nbytes / GiB:.2f} GiB); {rank}"
    )


def _eval_note(i: Inputs, b: Breakdown, first: PhaseEstimate | None, limit: int) -> str | None:
    over = [p for p in b.worst.phases if p.phase in (EVAL_FORWARD, GENERATE) and p.total > limit]
    if not over:
        return None
    when = i.eval_when or "when evaluation first runs (not stated)"
    lead = "it would cross too" if first is not None and first.phase not in (EVAL_FORWARD, GENERATE) else "it crosses"
    names = ", ".join(f"{p.title} {p.total / GiB:.2f} GiB" for p in over)
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


def _peak(est: Estimator, k: Knobs) -> int:
    return _train_peak(est, k)


def changes(i: Inputs, worst: BatchShape) -> list[Change]:
    """The single changes under which the train step of the worst batch fits (with the margin), ranked by predicted
    throughput
    (truncation first among equals: it changes the data, so it is listed, never applied silently)."""
    out: list[Change] = []
    for make in (_truncate, _checkpointing, _smaller_micro, _zero3):
        try:
            found = make(i, worst)
        except TunerError:  # the trace lacks the shape (e.g. checkpointing untraced): not offered
            found = None
        if found is not None:
            out.append(found)
    return sorted(out, key=lambda c: -c.speed)


def _train_peak(est: Estimator, k: Knobs) -> int:
    """The train step's peak (forward + backward, optimizer step), uncalibrated: what the run meets first; the eval
    phases are reported on their own (:func:`_eval_note`), as they run only when evaluation does."""
    phases = est.breakdown(k).worst.phases
    return max(p.total for p in phases if p.phase in (FORWARD_BACKWARD, OPTIMIZER_STEP))


def _fits(i: Inputs, k: Knobs) -> bool:
    return _train_peak(i.estimator, k) * (1 + i.margin) <= i.capacity


def _cut(i: Inputs, length: int) -> str:
    if i.lengths is None:
        return ""
    c = cut(i.lengths.input, length)
    return f"; cuts {c.samples:.2%} of samples, {c.tokens:.2%} of input tokens"


def _longest(i: Inputs, k: Knobs, upper: int) -> int | None:
    return largest(lambda n: _fits(i, k.model_copy(update={"max_length": n})), upper)


def _truncate(i: Inputs, worst: BatchShape) -> Change | None:
    k = _at(i.config, worst)
    length = _longest(i, k, worst.input_length)
    if length is None or length >= worst.input_length:
        return None
    return Change(
        f"truncate inputs at {length:,} tokens{_cut(i, length)}",
        _peak(i.estimator, k.model_copy(update={"max_length": length})),
        1.0,
        "same compute per kept token; changes your data, so only if you accept the cut",
        f"--max-length {length}",
        changes_job=True,
    )


def _checkpointing(i: Inputs, worst: BatchShape) -> Change | None:
    """Gradient checkpointing; where it alone does not hold the worst batch, with the longest truncation that does
    (longer than truncation alone allows)."""
    if i.config.gradient_checkpointing:
        return None
    k = _at(i.config, worst).model_copy(update={"gradient_checkpointing": True})
    basis = "the forward runs again in the backward: 4/3 the compute"
    space = _space_arg({"gradient_checkpointing": [True]})
    if _fits(i, k):
        return Change("gradient checkpointing", _peak(i.estimator, k), CHECKPOINTING_SPEED, basis, space=space)
    length = _longest(i, k, worst.input_length)
    if length is None:
        return None
    return Change(
        f"gradient checkpointing + truncate inputs at {length:,} tokens{_cut(i, length)}",
        _peak(i.estimator, k.model_copy(update={"max_length": length})),
        CHECKPOINTING_SPEED,
        basis + "; the cut changes your data",
        f"--max-length {length}",
        space=space,
        changes_job=True,
    )


def _smaller_micro(i: Inputs, worst: BatchShape) -> Change | None:
    micro = i.config.micro_batch_size
    for m in range(micro - 1, 0, -1):
        if i.global_batch is not None and i.global_batch % (m * i.world_size):
            continue
        k = _at(i.config, BatchShape(m, worst.input_length, worst.target_length))
        if _fits(i, k):
            acc = f", {i.global_batch // (m * i.world_size)} accumulation steps" if i.global_batch else ""
            return Change(
                f"micro batch {m}{acc} (global batch kept)",
                _peak(i.estimator, k),
                1.0,
                "same compute per sample; a smaller batch's lower GPU efficiency is not estimated (probe it)",
                space=_space_arg({"micro_batch_size": [m]}),
            )
    return None


def _zero3(i: Inputs, worst: BatchShape) -> Change | None:
    if i.config.engine != "deepspeed" or i.config.zero_stage == 3:
        return None
    k = _at(i.config, worst).model_copy(update={"zero_stage": 3})
    if not _fits(i, k):
        return None
    return Change(
        "ZeRO stage 3",
        _peak(i.estimator, k),
        1.0,
        "same compute; 1.5x ZeRO-2's communication (params gathered in forward and backward), not estimated",
        space=_space_arg({"zero_stage": [3]}),
    )


def _space_arg(space: dict[str, list[object]]) -> str:
    """The space file's YAML text holding the change (--space reads a YAML/TOML file)."""
    return ", ".join(f"{k}: [{', '.join(str(v).lower() for v in vs)}]" for k, vs in space.items())


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
