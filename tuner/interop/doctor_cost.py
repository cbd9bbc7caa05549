"""The number behind a `tuner doctor` finding, from the one estimate: the parts of
:meth:`tuner.memory.estimator.Estimator.breakdown`, the very numbers `tuner estimate` prints in its table (and
`tuner explain` in its parts), on one rank, uncalibrated. Pure: the estimator comes in (the CLI traces the model as
`tuner estimate` does)."""

from __future__ import annotations

from dataclasses import dataclass

from trials.contract import Knobs
from tuner.memory.breakdown import (
    ACTIVATIONS,
    FORWARD_BACKWARD,
    GENERATE,
    GENERATION_CACHE,
    OPTIMIZER_STEP,
    ZERO_BUFFERS,
)
from tuner.memory.estimator import Estimator

MiB = 1 << 20
GiB = 1 << 30
TRAIN_PHASES = (FORWARD_BACKWARD, OPTIMIZER_STEP)


@dataclass(frozen=True)
class Basis:
    """What the numbers are estimated for: the estimator (the model's trace, world size, global batch), the
    config's knobs as `tuner estimate` reads them from the same files, and that job in words."""

    estimator: Estimator
    knobs: Knobs
    described: str


@dataclass(frozen=True)
class Cost:
    """The bytes at stake (the estimate's part, one rank), that number in words and what it does not cover."""

    nbytes: int
    number: str
    not_covered: str


def size(n: int) -> str:
    """Bytes as `tuner estimate`'s table prints them (MiB), with GiB for reading."""
    return f"{n / MiB:,.1f} MiB ({n / GiB:.2f} GiB)"


def bucket_cost(basis: Basis, fixed: Knobs, fix: str) -> Cost | None:
    """The ZeRO buffers part of the train phase where it is largest, and what it is under ``fixed`` (``fix``: the
    change in words). None: the estimate has no train phase."""
    est, knobs = basis.estimator, basis.knobs
    phase = est.breakdown(knobs).worst.largest_part(ZERO_BUFFERS, TRAIN_PHASES)
    if phase is None:
        return None
    now = phase.part(ZERO_BUFFERS)
    after = est.breakdown(fixed).worst.phase(phase.phase).part(ZERO_BUFFERS)
    return Cost(
        nbytes=now,
        number=f"ZeRO buffers {size(now)} per rank in the {phase.title} (tuner estimate's 'ZeRO buffers' row); "
        f"with {fix}: {size(after)}, {size(now - after)} less",
        not_covered="the allocator's fragmentation of the buckets freed and re-made during backward",
    )


def eval_batch_cost(basis: Basis, smaller: int, when: str) -> Cost | None:
    """The generate phase's activations + generation cache at the eval batch (what grows with it), the phase's peak
    against the train step's, and the same at eval batch ``smaller``. None: the estimate has no generate phase (the
    trace has none)."""
    est, knobs = basis.estimator, basis.knobs
    ranks = est.breakdown(knobs).worst
    try:
        gen = ranks.phase(GENERATE)
    except KeyError:
        return None
    at_stake = gen.part(ACTIVATIONS) + gen.part(GENERATION_CACHE)
    train = max(ranks.phase(p).total for p in TRAIN_PHASES)
    after = est.breakdown(knobs.model_copy(update={"eval_batch_size": smaller})).worst.phase(GENERATE)
    than = "above" if gen.total >= train else "below"
    return Cost(
        nbytes=at_stake,
        number=f"generate at eval batch {knobs.eval_batch_size}: activations {size(gen.part(ACTIVATIONS))} + "
        f"generation cache {size(gen.part(GENERATION_CACHE))} per rank; phase peak {size(gen.total)}, {than} the "
        f"train step's {size(train)}; at eval batch {smaller}: {size(after.total)}; at stake only once evaluation "
        f"runs: {when}",
        not_covered="the eval batch's activations are scaled per sample from the traced eval batch; the Trainer's "
        "gathered predictions (token ids) are not in it",
    )
