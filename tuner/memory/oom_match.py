"""Which traced allocation is the one that failed: the OOM message's size matched to the trace (pure).

The trace names each phase's largest allocations at a short traced length (op, shape, dtype). An allocation whose
shape has ``k`` dimensions equal to the traced length grows as length^k (the attention scores and softmax: k = 2;
a hidden state: k = 1), and linearly in the batch dimension. So the failed size ``F`` is produced, at the batch of
the crash, at the length ``L = traced_length * (F / size at that batch) ** (1 / k)``; the match holds when a
sample of the data reaches ``L`` (the padded batch is that long) and the allocation at the whole number ``L`` is
within :data:`TOLERANCE` of ``F``. Allocations that do not grow with the length match only their own size.

A probe's own recorded failure (trials.contract.FailedAllocation: the op, shape and dtype that asked on the emulated
device, the phase and stage, the bytes in use) is attributed to the estimate's parts by :func:`attribute`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from trials.contract import DS_DEFAULT_BUCKET, FailedAllocation, Knobs
from tuner.memory.breakdown import (
    ACTIVATIONS,
    EVAL_FORWARD,
    FORWARD_BACKWARD,
    GENERATE,
    OPTIMIZER_STEP,
    PARTS,
    PHASE_TITLES,
    ZERO_BUFFERS,
    Breakdown,
    PhaseEstimate,
)
from tuner.memory.trace import Trace, TracedAllocation, same_mode, trace_at

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
            f"{_size(self.failed)} = the {self.dtype} {self.what} of the {PHASE_TITLES[self.phase]}, "
            f"{dims}, at {self.length:,} tokens ({_size(self.nbytes)}, {self.error:.1%} off; traced at "
            f"{self.traced_length:,} tokens and scaled as length^{_power(self)})"
        )


def _size(n: int) -> str:
    """GiB with two decimals, MiB below one GiB (a tiny model's allocations are not "0.03 GiB")."""
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):,.2f} MiB"


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
    trace: Trace,
    failed: int,
    batches: Mapping[str, int],
    longest: int,
    ckpt: bool,
    precision: str,
    cast_module: bool = False,
) -> list[Match]:
    """The traced allocations that reach ``failed`` bytes at some length up to ``longest`` (the data's longest
    padded input), per phase of ``batches`` (phase -> its batch: the micro batch, the eval batch) in their order,
    the nearest first within a phase; the longest traced point of the config's checkpointing and precision (in its
    engine's precision mode, ``cast_module``: tuner.memory.precision) is read."""
    points = [
        p
        for p in trace.points
        if p.gradient_checkpointing == ckpt and p.precision == precision and same_mode(p, cast_module)
    ]
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


# -- a probe's recorded failure (trials.contract.FailedAllocation) attributed to the estimate's parts ---------------
#: the phase of the estimate a probe's rank was in (its phase, and within a train step its stage)
_PHASE_OF = {"eval": EVAL_FORWARD, "generate": GENERATE}


def estimate_phase(phase: str | None, stage: str | None) -> str | None:
    """The estimate's phase of a recorded failure: a train step's optimizer step, its forward or backward (both in
    the forward + backward's peak), the eval forward, the generate; None where the record does not say (setup,
    or a train-step moment outside a module's forward, the backward and a torch optimizer's step)."""
    if phase == "train":
        if stage == "optimizer step":
            return OPTIMIZER_STEP
        return FORWARD_BACKWARD if stage in ("forward", "backward") else None
    return _PHASE_OF.get(phase or "")


@dataclass(frozen=True)
class Landing:
    """Where ``at`` bytes (in use + asked for, at the failure) fall in a phase's estimate stacked part by part in
    their printed order: inside ``part`` (its range ``start``-``end``), or past the estimate's ``total`` (None)."""

    phase: str
    part: str | None
    at: int
    start: int
    end: int
    total: int


def landing(estimate: PhaseEstimate, at: int) -> Landing:
    """The part of ``estimate`` (stacked in PARTS order, empty parts skipped) that ``at`` bytes reach into."""
    start = 0
    for name in PARTS:
        size = estimate.part(name)
        if size <= 0:
            continue
        if at <= start + size:
            return Landing(estimate.phase, name, at, start, start + size, estimate.total)
        start += size
    return Landing(estimate.phase, None, at, estimate.total, estimate.total, estimate.total)


@dataclass(frozen=True)
class Attribution:
    """A recorded failed allocation attributed to the estimate: its phase and part, how (``how``: the traced
    allocation of that op and shape, a ZeRO bucket of that size, or where it lands in the phase's stack), the traced
    allocation matched (``traced``: by op and shape, else by size), and where the failure lands in the stack."""

    phase: str | None
    part: str | None
    how: str
    traced: Match | None
    landing: Landing | None


def _exact(trace: Trace, failed: FailedAllocation, phase: str, knobs: Knobs) -> Match | None:
    """The traced allocation of the failure's op, dtype and shape at the config's own traced shape."""
    point = trace.find(*trace_at(knobs))
    if point is None or failed.op is None:
        return None
    for a in point.largest.get(phase, []):
        if a.op == failed.op and a.dtype == failed.dtype and list(a.shape) == list(failed.shape):
            return Match(phase, a.op, a.dtype, tuple(a.shape), a.nbytes, point.max_length, point.max_length, a.nbytes)
    return None


def zero_bucket(knobs: Knobs, nbytes: int) -> str | None:
    """The ZeRO buffer ``nbytes`` is exactly (tuner.memory.states.zero_buffers' sizes): a reduce bucket of
    ``reduce_bucket_size`` elements (fp32 under ZeRO-1, else the precision's width) or an all-gather bucket."""
    if knobs.engine != "deepspeed" or knobs.zero_stage == 0:
        return None
    w = 2 if knobs.precision in ("bf16", "fp16") else 4
    reduce = knobs.reduce_bucket_size or DS_DEFAULT_BUCKET
    allgather = knobs.allgather_bucket_size or DS_DEFAULT_BUCKET
    copies = ", overlap_comm keeps 2" if knobs.overlap_comm else ""
    width = 4 if knobs.zero_stage == 1 and knobs.contiguous_gradients else w
    if nbytes == width * reduce:
        return f"one ZeRO reduce bucket: reduce_bucket_size {reduce:,} x {width} bytes{copies}"
    if nbytes == w * allgather:
        return f"one ZeRO all-gather bucket: allgather_bucket_size {allgather:,} x {w} bytes"
    return None


def attribute(failed: FailedAllocation, knobs: Knobs, trace: Trace, breakdown: Breakdown) -> Attribution:
    """Which of the estimate's parts the recorded failure belongs to (pure): by the allocation itself where it is
    known (the traced allocation of its op and shape: activations + temporaries; a ZeRO bucket of its size), else
    by where in use + asked lands in the phase's estimate stacked part by part; the traced allocation of its size
    (match_failed, at the config's length) is named too when the op and shape were not traced."""
    phase = estimate_phase(failed.phase, failed.stage)
    rank = breakdown.worst
    where = None
    if phase is not None and any(p.phase == phase for p in rank.phases):
        where = landing(rank.phase(phase), failed.live + failed.nbytes)
    traced = _exact(trace, failed, phase, knobs) if phase is not None else None
    if traced is None and phase is not None:
        batch = knobs.eval_batch_size or knobs.micro_batch_size if phase in (EVAL_FORWARD, GENERATE) else None
        sized = match_failed(
            trace,
            failed.nbytes,
            {phase: batch or knobs.micro_batch_size},
            knobs.max_length,
            knobs.gradient_checkpointing,
            knobs.precision,
        )
        traced = next((m for m in sized if m.length == knobs.max_length), None)
    if traced is not None:
        how = "its op and shape in the trace" if traced.op == failed.op else "its size: a traced allocation's"
        return Attribution(phase, ACTIVATIONS, how, traced, where)
    bucket = zero_bucket(knobs, failed.nbytes)
    if bucket is not None:
        return Attribution(phase, ZERO_BUFFERS, f"its size: {bucket}", None, where)
    if where is not None:
        return Attribution(phase, where.part, "where in use + asked lands in the estimate's stack", None, where)
    return Attribution(phase, None, "the record does not say which phase of the estimate it was in", None, None)
