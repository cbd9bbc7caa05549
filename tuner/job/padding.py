"""Batches as the user's collator makes them: the worst one a rank sees, and batches drawn for timed steps.

``padding="longest"`` pads each micro batch to its longest sample (DataCollatorForSeq2Seq, DataCollatorWithPadding:
the Trainer's default); ``"max_length"`` pads every batch to the job's length. A length limit (``max_length`` for
inputs, ``max_target_length`` for labels) truncates first; None truncates nothing, as the user's args do.

The worst batch is per rank: each of N ranks draws its own micro batch, so each rank's worst case is its own batch of
the longest samples (one rank full while the others idle). It is ``micro_batch`` samples padded to the longest input
and the longest target: exact when the two longest come in one sample or micro_batch >= 2 (any two samples can share
a shuffled batch), an upper bound for micro_batch 1 otherwise. Pure: numpy, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from tuner.errors import ConfigError
from tuner.job.lengths import IntArray, SampleLengths

Padding = Literal["longest", "max_length"]
PADDINGS: tuple[str, ...] = get_args(Padding)


@dataclass(frozen=True)
class Collation:
    padding: Padding = "longest"
    max_length: int | None = None  # inputs truncated here (None: not truncated)
    max_target_length: int | None = None  # labels truncated here (None: not truncated)

    def __post_init__(self) -> None:
        if self.padding not in PADDINGS:
            raise ConfigError(f"padding {self.padding!r} is unknown; give one of {', '.join(PADDINGS)}")
        if self.padding == "max_length" and self.max_length is None:
            raise ConfigError("padding max_length needs a length: give --max-length, or --padding longest")

    def clip(self, lengths: SampleLengths) -> SampleLengths:
        """The lengths after truncation."""
        i = lengths.input if self.max_length is None else np.minimum(lengths.input, self.max_length)
        t = lengths.target
        if t is not None and self.max_target_length is not None:
            t = np.minimum(t, self.max_target_length)
        return SampleLengths(input=i, target=t)

    def pad(self, longest_input: int, longest_target: int | None) -> tuple[int, int | None]:
        """The padded (input, target) lengths of a batch whose longest (already truncated) samples are given."""
        if self.padding == "longest":
            return longest_input, longest_target
        assert self.max_length is not None
        target_pad = self.max_target_length or self.max_length
        return self.max_length, None if longest_target is None else target_pad


@dataclass(frozen=True)
class BatchShape:
    """One rank's micro batch: ``batch`` samples padded to ``input_length`` (and ``target_length`` labels)."""

    batch: int
    input_length: int
    target_length: int | None = None
    real_tokens: int | None = None  # drawn batches: the input tokens its samples hold after truncation (no padding)
    padded: bool = False  # a sample shorter than input_length: the collator pads it (the attention mask has zeros)

    @property
    def tokens(self) -> int:
        """Padded tokens in the batch, inputs and labels."""
        return self.batch * (self.input_length + (self.target_length or 0))

    def describe(self) -> str:
        labels = f" -> {self.target_length:,} label tokens" if self.target_length is not None else ""
        return f"{self.batch} x {self.input_length:,} tokens{labels}"


def worst_batch(lengths: SampleLengths, micro_batch: int, collation: Collation) -> BatchShape:
    """The largest micro batch one rank can get from this data (see the module's note on micro_batch 1)."""
    if micro_batch < 1:
        raise ConfigError(f"micro batch {micro_batch} is not a batch size; give 1 or more")
    if not len(lengths):
        raise ConfigError("no samples: the dataset is empty")
    clipped = collation.clip(lengths)
    target = None if clipped.target is None else int(clipped.target.max())
    inp, tgt = collation.pad(int(clipped.input.max()), target)
    return BatchShape(micro_batch, inp, tgt, padded=worst_is_padded(clipped, micro_batch, inp))


def worst_is_padded(clipped: SampleLengths, micro_batch: int, input_length: int) -> bool:
    """Whether the worst batch can hold padding: a sample shorter than its input length shares it (micro batch 2 or
    more, any two samples can meet), or fills it alone (padding to max_length). A padded batch is the worse one: a
    causal LM builds its attention mask for it."""
    shortest = int(clipped.input.min())
    return shortest < input_length and (micro_batch >= 2 or int(clipped.input.max()) < input_length)


#: the sampler's order of one epoch over the (clipped) input lengths: their Trainer's sampler (tuner.probing.batches)
Sampler = Callable[[IntArray, int], IntArray]


def draw_batches(
    lengths: SampleLengths,
    micro_batch: int,
    collation: Collation,
    count: int,
    seed: int = 0,
    sampler: Sampler | None = None,
) -> list[BatchShape]:
    """``count`` micro batches as a shuffled epoch makes them (seeded; ``sampler(input lengths, epoch)``: their
    Trainer's sampler's order instead), each padded as the collator pads it, with the real input tokens it holds."""
    if micro_batch < 1 or count < 0:
        raise ConfigError(f"cannot draw {count} batches of {micro_batch} samples")
    clipped = collation.clip(lengths)
    n = len(clipped)
    if not n:
        raise ConfigError("no samples: the dataset is empty")
    rng = np.random.default_rng(seed)
    order: IntArray = np.empty(0, dtype=np.int64)
    need = count * micro_batch
    epoch = 0
    while len(order) < need:  # more epochs when the data is smaller than the draw
        drawn = sampler(clipped.input, epoch) if sampler is not None else rng.permutation(n)
        order = np.concatenate([order, np.asarray(drawn, dtype=np.int64)])
        epoch += 1
    out = []
    for k in range(count):
        idx = order[k * micro_batch : (k + 1) * micro_batch]
        target = None if clipped.target is None else int(clipped.target[idx].max())
        inp, tgt = collation.pad(int(clipped.input[idx].max()), target)
        real = int(clipped.input[idx].sum())
        out.append(BatchShape(micro_batch, inp, tgt, real_tokens=real, padded=real < micro_batch * inp))
    return out


def mean_tokens(batches: list[BatchShape]) -> float:
    """Mean padded tokens per batch (what the device computes on, padding included)."""
    return sum(b.tokens for b in batches) / len(batches) if batches else 0.0


def real_tokens_per_sample(lengths: SampleLengths, collation: Collation) -> float:
    """Mean tokens a sample keeps after truncation, inputs and labels (tokens/s = samples/s x this)."""
    clipped = collation.clip(lengths)
    if not len(clipped):
        return 0.0
    total = clipped.input.sum() + (clipped.target.sum() if clipped.target is not None else 0)
    return float(total) / len(clipped)
