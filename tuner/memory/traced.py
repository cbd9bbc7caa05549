"""Reading the trace at a config's shape: a traced point's value, or an interpolation over the traced lengths
(activations grow like batch x (a*len + b*len^2)), and the largest allocations of a phase scaled to the shape.

The trace is taken at a few short lengths (a trace of flan-t5-large at 6,352 tokens takes minutes on CPU); a longer
config is extrapolated from the fit, and its named allocations are the traced ones with the batch and length
dimensions scaled, saying so (``Allocation.traced_at``)."""

from __future__ import annotations

import math
from collections.abc import Callable

from trials.contract import Knobs
from tuner.errors import ConfigError
from tuner.memory.breakdown import Allocation
from tuner.memory.precision import traced_precision
from tuner.memory.trace import Trace, TracePoint, same_mode

SHOWN = 3  # allocations named per phase, the largest at the config's shape (the trace keeps more, for the scaling)
_ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "bool": 1, "int8": 1}


def _same(trace: Trace, knobs: Knobs) -> list[TracePoint]:
    """The points traced with the config's checkpointing and precision, in its engine's precision mode."""
    cast = traced_precision(knobs).cast_module
    return [
        p
        for p in trace.points
        if p.gradient_checkpointing == knobs.gradient_checkpointing
        and p.precision == knobs.precision
        and same_mode(p, cast)
    ]


def traced(
    trace: Trace,
    knobs: Knobs,
    value: Callable[[TracePoint], int | None],
    batch: Callable[[TracePoint], int] = lambda p: p.micro_batch_size,
    wanted: int | None = None,
) -> int | None:
    """``value`` at the config's shape: the traced point's (same micro batch, length, checkpointing, precision;
    same ``batch``), or per sample of ``batch`` fitted over the traced lengths and times ``wanted`` (default: the
    micro batch). None: no traced point has the value. A shape whose checkpointing/precision was never traced: a
    ConfigError saying to trace it. A padding-free trace (``Trace.padding_free``: each batch one row of batch x
    length tokens, attention quadratic in that row): every point read as one row of its flattened length, and the
    config's value fitted at its own flattened length."""
    want = knobs.micro_batch_size if wanted is None else wanted
    if trace.padding_free is not None:
        flat = knobs.model_copy(update={"micro_batch_size": 1, "max_length": want * knobs.max_length})
        rows = [p.model_copy(update={"max_length": batch(p) * p.max_length}) for p in trace.points]
        return traced(trace.model_copy(update={"points": rows, "padding_free": None}), flat, value, lambda p: 1, 1)
    same = _same(trace, knobs)
    if not same:
        mode = " (the module cast, as DeepSpeed runs it)" if traced_precision(knobs).cast_module else ""
        raise ConfigError(
            "the trace has no point with gradient_checkpointing="
            f"{knobs.gradient_checkpointing} precision={knobs.precision}{mode}; trace one first"
        )
    have = [(p, v) for p in same if (v := value(p)) is not None]
    for p, v in have:
        if p.max_length == knobs.max_length and batch(p) == want:
            return v
    if not have:
        return None
    a, b = fit_length_curve([(p.max_length, v / batch(p)) for p, v in have])
    s = knobs.max_length
    return max(0, int(want * (a * s + b * s * s)))


def fit_length_curve(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Fits per-sample bytes ~= a*len + b*len^2 (b >= 0) through the points; one length gives b = 0."""
    lengths = {s for s, _ in points}
    if len(lengths) == 1:
        s = points[0][0]
        return sum(v for _, v in points) / len(points) / s, 0.0
    s11 = sum(s * s for s, _ in points)
    s12 = sum(s**3 for s, _ in points)
    s22 = sum(s**4 for s, _ in points)
    y1 = sum(s * v for s, v in points)
    y2 = sum(s * s * v for s, v in points)
    det = s11 * s22 - s12 * s12
    a = (y1 * s22 - y2 * s12) / det
    b = (s11 * y2 - s12 * y1) / det
    if b < 0:
        return y1 / s11, 0.0
    return a, b


def named(trace: Trace, knobs: Knobs, phase: str, batch: int | None = None) -> tuple[Allocation, ...]:
    """The phase's largest traced allocations at the config's shape: from the traced point of that shape, else from
    the longest traced point with the batch and length dimensions scaled (say so: ``traced_at``)."""
    want = knobs.micro_batch_size if batch is None else batch
    candidates = [p for p in _same(trace, knobs) if p.largest.get(phase)]
    if not candidates:
        return ()
    exact = [p for p in candidates if p.max_length == knobs.max_length]
    point = (exact or sorted(candidates, key=lambda p: p.max_length))[-1]
    traced_batch = point.eval_batch_size if phase in ("eval_forward", "generate") else point.micro_batch_size
    scale = {point.max_length: knobs.max_length}
    if traced_batch:
        scale.setdefault(traced_batch, want)
    out = []
    for a in point.largest[phase]:
        if not exact or traced_batch != want:
            shape = tuple(scale.get(d, d) for d in a.shape)
            size = _ITEMSIZE.get(a.dtype)
            nbytes = math.prod(shape) * size if size else a.nbytes
            out.append(Allocation(a.op, shape, a.dtype, nbytes, (traced_batch or 0, point.max_length)))
        else:
            out.append(Allocation(a.op, tuple(a.shape), a.dtype, a.nbytes))
    return tuple(sorted(out, key=lambda x: -x.nbytes)[:SHOWN])
