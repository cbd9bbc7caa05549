"""When would this config crash? The share of micro batches that do not fit, and the samples until the first one.

Given ``need`` (the peak device bytes of one rank's micro batch of a given padded shape, from the one shared
estimate) and the data's lengths, a batch fits iff need(its shape) <= the limit. ``need`` grows with both the input
and the target length, so the (input, target) pairs that fit form a staircase: for each input length ``a`` the longest
target ``T(a)`` that still fits, non-increasing in ``a`` (found by one two-pointer walk, O(distinct lengths) calls of
``need``). A batch of ``b`` samples padded to its longest fits iff its longest target <= T(its longest input), so

    P(fits) = sum over input lengths a of  p(a)^b - q(a)^b,

p(a) = share of samples with input <= a and target <= T(a), q(a) the same with input < a. This is exact for batches
drawn with replacement; a shuffled epoch draws without, which differs by about b/n (nothing at 100k samples).

With N ranks each step draws N batches and crashes when any rank's does not fit; the step of the first crash is
geometric, so the samples until it (median and 90%) follow in closed form. Pure: numpy, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tuner.errors import ConfigError
from tuner.job.lengths import IntArray, SampleLengths
from tuner.job.padding import BatchShape, Collation, worst_batch

Need = Callable[[BatchShape], float]


@dataclass(frozen=True)
class CrashOdds:
    limit: int  # bytes a rank may use
    micro_batch: int
    world_size: int
    unfit_share: float  # share of one rank's micro batches that need more than the limit
    worst: BatchShape
    worst_need: float
    median_samples: int | None  # samples consumed by the first crashing step (None: no batch crashes)
    p90_samples: int | None

    @property
    def fits_worst(self) -> bool:
        return self.worst_need <= self.limit

    def describe(self) -> str:
        limit = _gib(self.limit)
        if self.unfit_share <= 0:
            return f"every batch fits in {limit} (the worst, {self.worst.describe()}, needs {_gib(self.worst_need)})"
        if self.unfit_share >= 1:
            return f"every batch needs more than {limit}: the run crashes at its first step"
        one_in = max(1, round(1 / self.unfit_share))
        return (
            f"1 batch in {one_in:,} needs more than {limit} (the worst, {self.worst.describe()}, needs "
            f"{_gib(self.worst_need)}): with shuffling your run crashes after about {self.median_samples:,} samples "
            f"(median; 90% within {self.p90_samples:,})"
        )


def _gib(n: float) -> str:
    """79.15 GiB as the CUDA OOM message writes it; below a GiB, MiB."""
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def staircase(inputs: IntArray, targets: IntArray, fits: Callable[[int, int], bool]) -> IntArray:
    """For each of the sorted distinct ``inputs``, the largest of the sorted distinct ``targets`` that fits with it
    (-1 when none does). ``fits`` is monotone: a longer input or target never fits where a shorter one does not."""
    out = np.full(len(inputs), -1, dtype=np.int64)
    j = len(targets) - 1
    for k, a in enumerate(inputs.tolist()):
        while j >= 0 and not fits(a, int(targets[j])):
            j -= 1
        if j < 0:
            break  # a longer input fits with no target either
        out[k] = targets[j]
    return out


def _fit_counts(
    inp: IntArray, tgt: IntArray, weight: IntArray, distinct: IntArray, ceiling: IntArray
) -> tuple[IntArray, IntArray]:
    """Per distinct input a: samples with input <= a and target <= T(a), and with input < a and target <= T(a)
    (each row counted ``weight`` times: a summary's cell stands for that many samples)."""
    t_values = np.unique(tgt)
    tree = [0] * (len(t_values) + 1)  # Fenwick tree over target ranks (a list: numpy scalar access is slower)

    def add(rank: int, w: int) -> None:
        rank += 1
        while rank < len(tree):
            tree[rank] += w
            rank += rank & -rank

    def below(rank: int) -> int:  # samples added with target rank <= rank
        total, rank = 0, rank + 1
        while rank > 0:
            total += tree[rank]
            rank -= rank & -rank
        return total

    order = np.argsort(inp, kind="stable")
    ranks = np.searchsorted(t_values, tgt[order]).tolist()
    sorted_inp = inp[order].tolist()
    weights = weight[order].tolist()
    le, lt = np.zeros(len(distinct), dtype=np.int64), np.zeros(len(distinct), dtype=np.int64)
    i = 0
    for k, a in enumerate(distinct.tolist()):
        cap = int(np.searchsorted(t_values, ceiling[k], side="right")) - 1  # rank of the largest target <= T(a)
        lt[k] = below(cap) if cap >= 0 else 0
        while i < len(sorted_inp) and sorted_inp[i] == a:
            add(ranks[i], weights[i])
            i += 1
        le[k] = below(cap) if cap >= 0 else 0
    return le, lt


def unfit_share(
    lengths: SampleLengths,
    micro_batch: int,
    collation: Collation,
    need: Need,
    limit: float,
    counts: IntArray | None = None,
) -> float:
    """The share of one rank's shuffled micro batches that need more than ``limit`` bytes. ``counts``: how many
    samples each row of ``lengths`` stands for (a summary's cells, tuner.job.length_summary); None: one each."""
    clipped = collation.clip(lengths)
    weight = np.ones(len(clipped), dtype=np.int64) if counts is None else np.asarray(counts, dtype=np.int64)
    if len(weight) != len(clipped) or (len(weight) and int(weight.min()) < 1):
        raise ConfigError(f"{len(weight)} counts for {len(clipped)} lengths; give one positive count per row")
    n = int(weight.sum())
    if not n:
        raise ConfigError("no samples: the dataset is empty")
    inp = clipped.input
    tgt = clipped.target if clipped.target is not None else np.zeros(len(inp), dtype=np.int64)
    seq2seq = clipped.target is not None

    def fits(a: int, t: int) -> bool:
        padded_in, padded_tgt = collation.pad(a, t if seq2seq else None)
        return need(BatchShape(micro_batch, padded_in, padded_tgt)) <= limit

    distinct = np.unique(inp)
    ceiling = staircase(distinct, np.unique(tgt), fits)
    le, lt = _fit_counts(inp, tgt, weight, distinct, ceiling)
    fit = float(np.sum((le / n) ** micro_batch - (lt / n) ** micro_batch))
    return min(1.0, max(0.0, 1.0 - fit))


def samples_until_crash(share: float, micro_batch: int, world_size: int, quantile: float) -> int | None:
    """Samples consumed by the step of the first crash, at ``quantile`` of its (geometric) distribution."""
    if share <= 0:
        return None
    step_share = 1.0 - (1.0 - share) ** world_size
    if step_share >= 1:
        steps = 1
    else:
        steps = max(1, math.ceil(math.log(1 - quantile) / math.log1p(-step_share)))
    return steps * micro_batch * world_size


def crash_odds(
    lengths: SampleLengths,
    micro_batch: int,
    world_size: int,
    collation: Collation,
    need: Need,
    limit: int,
    counts: IntArray | None = None,
) -> CrashOdds:
    """``counts``: as unfit_share's (a summary's cells; None: one sample per row)."""
    if world_size < 1:
        raise ConfigError(f"world size {world_size} is not a number of ranks; give 1 or more")
    worst = worst_batch(lengths, micro_batch, collation)
    worst_need = float(need(worst))
    # the worst batch fits: every batch does (need is monotone), and 1 - sum(...) would leave float dust (1e-16)
    share = 0.0 if worst_need <= limit else unfit_share(lengths, micro_batch, collation, need, limit, counts)
    return CrashOdds(
        limit=limit,
        micro_batch=micro_batch,
        world_size=world_size,
        unfit_share=share,
        worst=worst,
        worst_need=worst_need,
        median_samples=samples_until_crash(share, micro_batch, world_size, 0.5),
        p90_samples=samples_until_crash(share, micro_batch, world_size, 0.9),
    )
