"""FSDP2's phases and parts per rank, from the trace of its own probe (trials.trace_fsdp; pure, no torch).

An FSDP2 config's memory is traced as its probe runs it, not derived from the plain trace: which blocks' parameters
are gathered at the peak (``reshard_after_forward``), the unsharded grads ``no_sync`` keeps between micro-steps, the
all-gather / reduce-scatter buffers, the mixed precision policy's casts and the offload policy are ``fully_shard``'s
own schedule. A config is read at its traced point (same checkpointing, precision, FSDP2 knobs, world size and
accumulation); another micro batch or length of a traced one is fitted: the peak above the states less the gathered
parameters as ``c + micro x (a*len + b*len^2)`` (the constant: the grads and buffers that do not grow with the
batch), the states and the gathered parameters as traced.

Parts per phase: the parameter shards, the optimizer state (AdamW's shards; on the host under offload_params), the
gathered parameters at the peak (``GATHERED``), and the rest (activations, temporaries, the unsharded grads in
flight, the collectives' buffers).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from trials.contract import Knobs
from tuner.errors import ConfigError
from tuner.memory.breakdown import (
    ACTIVATIONS,
    EVAL_FORWARD,
    FORWARD_BACKWARD,
    GATHERED,
    GENERATE,
    GENERATION_CACHE,
    GRADIENTS,
    OPTIMIZER,
    OPTIMIZER_STEP,
    PARAMETERS,
    Part,
    PhaseEstimate,
)
from tuner.memory.states import StateBytes
from tuner.memory.trace import FsdpPoint, Trace


def matching(trace: Trace, k: Knobs, world_size: int, accumulates: bool) -> list[FsdpPoint]:
    """The traced FSDP2 points of ``k``'s kind (every traced micro batch and length); a ConfigError when none is (or
    the model cannot be sharded: the refusal's reason)."""
    same = [
        p
        for p in trace.fsdp_points
        if (p.gradient_checkpointing, p.precision, p.reshard_after_forward, p.offload_params)
        == (k.gradient_checkpointing, k.precision, k.reshard_after_forward, k.offload_params)
        and p.world_size == world_size
        and p.accumulates == accumulates
    ]
    refused = next((p.refused for p in same if p.refused), None)
    if refused:
        raise ConfigError(refused)
    if not same:
        raise ConfigError(
            f"the trace has no FSDP2 point with gradient_checkpointing={k.gradient_checkpointing} "
            f"precision={k.precision} reshard_after_forward={k.reshard_after_forward} "
            f"offload_params={k.offload_params} on {world_size} rank(s)"
            f"{' accumulating' if accumulates else ''}; trace one first"
        )
    return same


def _nearest(points: list[FsdpPoint], k: Knobs) -> FsdpPoint:
    """The traced point nearest ``k``'s shape (tokens per micro-step, then length)."""
    want = math.log(k.micro_batch_size * k.max_length)
    return min(points, key=lambda p: (abs(math.log(p.micro_batch_size * p.max_length) - want), -p.max_length))


def fitted(
    points: list[FsdpPoint],
    value: Callable[[FsdpPoint], int | None],
    batch: Callable[[FsdpPoint], int],
    want: int,
    length: int,
    flat: bool = False,
) -> int | None:
    """``value`` at (``want`` samples, ``length``): a traced point's own, else ``c + n x (a*len + b*len^2)`` least
    squares over the traced points (c >= 0, b >= 0; the constant only where two batch sizes or token counts tell it
    from the per-sample term). ``flat``: a padding-free trace (each batch one row of n x len tokens), every point and
    the config read as one row of its flattened length."""
    have = [(batch(p), p.max_length, float(got)) for p in points if (got := value(p)) is not None]
    if flat:
        have, want, length = [(1, n * s, v) for n, s, v in have], 1, want * length
    for n, s, v in have:
        if (n, s) == (want, length):
            return int(v)
    if not have:
        return None
    c, a, b = fit_constant_and_curve(have)
    return max(0, int(c + want * (a * length + b * length * length)))


def fit_constant_and_curve(points: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """(c, a, b) of v ~= c + n*(a*len + b*len^2) over (n, len, v); drops b, then c, where the points cannot tell them
    apart or they come out negative."""
    lengths = {s for _, s, _ in points}
    tokens = {n * s for n, s, _ in points}
    for use_c, use_b in ((True, True), (True, False), (False, True), (False, False)):
        if (use_c and len(tokens) < 2) or (use_b and len(lengths) < 2):
            continue
        if use_c and use_b and len(points) < 3:
            continue
        rows = [([1.0] * use_c + [float(n * s)] + [float(n * s * s)] * use_b, v) for n, s, v in points]
        t = _least_squares(rows)
        c = t[0] if use_c else 0.0
        a = t[1 if use_c else 0]
        b = t[-1] if use_b else 0.0
        if c >= 0 and b >= 0 and (a >= 0 or use_b):
            return c, a, b
    n0, s0, v0 = points[0]
    return 0.0, v0 / (n0 * s0), 0.0


def _least_squares(rows: list[tuple[list[float], float]]) -> list[float]:
    """Solves min |X t - y| by the normal equations (at most 3 unknowns; Gauss-Jordan with partial pivoting)."""
    m = len(rows[0][0])
    a = [[sum(x[i] * x[j] for x, _ in rows) for j in range(m)] + [sum(x[i] * y for x, y in rows)] for i in range(m)]
    for c in range(m):
        piv = max(range(c, m), key=lambda r: abs(a[r][c]))
        a[c], a[piv] = a[piv], a[c]
        for r in range(m):
            if r != c and a[c][c]:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c], strict=True)]
    return [a[i][m] / a[i][i] if a[i][i] else 0.0 for i in range(m)]


def fsdp_states(points: list[FsdpPoint], k: Knobs) -> StateBytes:
    """The model states on a rank's device as traced: the parameter shards and the optimizer state (AdamW's
    exp_avg / exp_avg_sq shards; on the host under offload_params); no grads between steps."""
    p = _nearest(points, k)
    return StateBytes(params=p.param_shard_bytes, grads=0, optimizer=p.states_bytes - p.param_shard_bytes, buffers=0)


def fsdp_phases(points: list[FsdpPoint], k: Knobs, flat: bool = False) -> list[PhaseEstimate]:
    """The config's phases part by part on one rank (FSDP2 ranks hold equal, padded shards); ``flat``: traced
    padding-free (``fitted``)."""
    st = fsdp_states(points, k)
    near = _nearest(points, k)
    n = near.world_size
    host = "host memory (offload_params)" if k.offload_params else ""
    shard_note = host or f"fp32 shards, 1/{n} of the model a rank"
    states = (
        Part(PARAMETERS, st.params, shard_note),
        Part(OPTIMIZER, st.optimizer, host or f"AdamW's shards, 1/{n} a rank"),
    )
    micro, length = k.micro_batch_size, k.max_length

    def at(value: Callable[[FsdpPoint], int | None]) -> int | None:
        return fitted(points, value, lambda p: p.micro_batch_size, micro, length, flat)

    rest = at(lambda p: p.forward_backward_bytes - p.gathered_bytes) or 0
    held = "kept to the backward (reshard_after_forward false)" if not k.reshard_after_forward else "resharded"
    gathered = Part(GATHERED, near.gathered_bytes, f"all-gathered parameters at the peak, each block {held}")
    grads_note = "reduce-scattered block by block in the backward (in flight: in the activations part)"
    if near.accumulates:
        grads_note = "unsharded grads kept between micro-steps under no_sync (in the activations part)"
    flight = "fake-tensor FSDP2 trace: activations, temporaries, unsharded grads in flight, collective buffers"
    phases = [
        PhaseEstimate(
            FORWARD_BACKWARD,
            (*states, Part(GRADIENTS, 0, grads_note), gathered, Part(ACTIVATIONS, rest, flight)),
        ),
        PhaseEstimate(
            OPTIMIZER_STEP,
            (
                *states,
                Part(ACTIVATIONS, at(lambda p: p.step_bytes) or 0, "the grad shards, clipping and AdamW's temporaries"),
            ),
        ),
    ]
    return phases + _eval_phases(points, k, states, flat)


def _eval_phases(points: list[FsdpPoint], k: Knobs, states: tuple[Part, ...], flat: bool) -> list[PhaseEstimate]:
    if k.eval_batch_size is None and not k.generate:
        return []
    size = k.eval_batch_size or k.micro_batch_size

    def at(value: Callable[[FsdpPoint], int | None]) -> int | None:
        return fitted(points, value, lambda p: p.eval_batch_size or 1, size, k.max_length, flat)

    out = []
    note = f"eval batch {size}, the blocks gathered one by one as in training"
    forward = at(lambda p: p.eval_bytes)
    if forward is not None:
        out.append(PhaseEstimate(EVAL_FORWARD, (*states, Part(ACTIVATIONS, forward, note))))
    decode, cache = at(lambda p: p.generate_bytes), at(lambda p: p.generate_cache_bytes)
    if k.generate and decode is not None:
        c = cache or 0
        parts = (
            *states,
            Part(ACTIVATIONS, max(0, decode - c), note),
            Part(GENERATION_CACHE, c, "KV cache, full length"),
        )
        out.append(PhaseEstimate(GENERATE, parts))
    return out
