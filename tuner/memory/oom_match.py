"""Which traced allocation is the one that failed: the OOM message's size matched to the trace (pure).

The trace names each phase's largest allocations at a short traced length (op, shape, dtype). An allocation whose
shape has ``k`` dimensions equal to the traced length grows as length^k (the attention scores and softmax: k = 2;
a hidden state: k = 1), and linearly in the batch dimension. So the failed size ``F`` is produced, at the batch of
the crash, at the length ``L = traced_length * (F / size at that batch) ** (1 / k)``; the match holds when a
sample of the data reaches ``L`` (the padded batch is that long) and the allocation at the whole number ``L`` is
within :data:`TOLERANCE` of ``F``. Allocations that do not grow with the length match only their own size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from tuner.memory.breakdown import FORWARD_BACKWARD, PHASE_TITLES
from tuner.memory.trace import Trace, TracedAllocation

TOLERANCE = 0.05


@dataclass(frozen=True)
class Match:
    """The traced allocation of the failed size: its phase, op, dtype and shape at ``length`` tokens."""

    phase: str
    op: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int  # at ``length``
    length: int
    traced_length: int
    failed: int

    @property
    def error(self) -> float:
        return abs(self.nbytes - self.failed) / self.failed

    @property
    def what(self) -> str:
        """The allocation in words: an L x L matrix per head is the attention's (scores, softmax, dropout: one
        size), named with the op the trace saw."""
        square = len(self.shape) >= 3 and self.shape[-1] == self.shape[-2] == self.length
        return f"attention matrix (softmax-sized, op {self.op})" if square else self.op

    def describe(self) -> str:
        dims = " x ".join(f"{d:,}" for d in self.shape)
        return (
            f"{self.failed / (1 << 30):.2f} GiB = the {self.dtype} {self.what} of the {PHASE_TITLES[self.phase]}, "
            f"{dims}, at {self.length:,} tokens ({self.nbytes / (1 << 30):.2f} GiB, {self.error:.1%} off; traced at "
            f"{self.traced_length:,} tokens and scaled as length^{_power(self)})"
        )


def _power(m: Match) -> int:
    return sum(1 for d in m.shape if d == m.length) or 0


def _scaled(a: TracedAllocation, traced_len: int, traced_batch: int, batch: int, length: int) -> tuple[int, ...]:
    out = []
    for d in a.shape:
        if d == traced_len:
            out.append(length)
        elif d == traced_batch and d != traced_len:
            out.append(batch)
        else:
            out.append(d)
    return tuple(out)


def _candidate(
    a: TracedAllocation, phase: str, traced_len: int, traced_batch: int, batch: int, failed: int, longest: int
) -> Match | None:
    k = sum(1 for d in a.shape if d == traced_len)
    at_batch = a.nbytes * (batch / traced_batch if traced_batch in a.shape and traced_batch != traced_len else 1)
    if k == 0:
        length = traced_len
    else:
        length = round(traced_len * (failed / at_batch) ** (1 / k))
    if length < 1 or length > longest:
        return None
    shape = _scaled(a, traced_len, traced_batch, batch, length)
    nbytes = int(at_batch * (length / traced_len) ** k)
    match = Match(phase, a.op, a.dtype, shape, nbytes, length, traced_len, failed)
    return match if match.error <= TOLERANCE else None


def match_failed(
    trace: Trace, failed: int, batches: Mapping[str, int], longest: int, ckpt: bool, precision: str
) -> list[Match]:
    """The traced allocations that reach ``failed`` bytes at some length up to ``longest`` (the data's longest
    padded input), per phase of ``batches`` (phase -> its batch: the micro batch, the eval batch) in their order,
    the nearest first within a phase; the longest traced point of the config's checkpointing and precision is read."""
    points = [p for p in trace.points if p.gradient_checkpointing == ckpt and p.precision == precision]
    out: list[Match] = []
    for phase, batch in batches.items():
        having = [p for p in points if p.largest.get(phase)]
        if not having:
            continue
        point = max(having, key=lambda p: p.max_length)
        traced_batch = (
            point.eval_batch_size or point.micro_batch_size
            if phase != FORWARD_BACKWARD and phase != "optimizer_step"
            else point.micro_batch_size
        )
        found = [
            m
            for a in point.largest[phase]
            if (m := _candidate(a, phase, point.max_length, traced_batch, batch, failed, longest)) is not None
        ]
        out += sorted(found, key=lambda m: (m.error, -math.prod(m.shape)))
    return out
