"""The memory estimate for a search: a fake-tensor trace of the user's model at a few shapes (memory.estimator)."""

from __future__ import annotations

import time

from tuner.errors import TunerError
from tuner.job.space import Space
from tuner.memory.estimator import Estimator, trace, zero_stage_need
from tuner.search.request import SearchRequest

ESTIMATE_AUTO_MIN_BUDGET_S = 600.0  # below this, tracing costs too large a share of the budget


def trace_points(space: Space) -> list[tuple[int, int, bool, str]]:
    """The smallest and largest micro batch per (max_length, checkpointing, precision): the estimator scales
    activations linearly in the micro batch and fits the length curve, so these few points cover the space."""
    micros = sorted({min(space.micro_batch_size), max(space.micro_batch_size)})
    return [
        (m, length, ckpt, prec)
        for m in micros
        for length in space.max_length
        for ckpt in space.gradient_checkpointing
        for prec in space.precision
    ]


#: with the user's data, the longest input length traced: a CPU fake-tensor trace of a large model at the data's
#: longest samples (6,000+ tokens) takes minutes; longer inputs follow the fitted a*L + b*L^2 (attention's L^2 term)
DATA_TRACE_CAP = 2048


def data_points(request: SearchRequest) -> list[tuple[int, int, bool, str]] | None:
    """With the user's data (None without): the space's points at most DATA_TRACE_CAP long, plus the data's median
    input length, so the estimator fits how activations grow with length instead of assuming proportion."""
    if request.data is None:
        return None
    from tuner.job.lengths import Quantiles

    short = Quantiles.of(request.data.lengths.input).p50
    points = trace_points(request.space)
    micro = min(p[0] for p in points)
    out = {(m, min(length, DATA_TRACE_CAP), ckpt, prec) for m, length, ckpt, prec in points}
    out |= {(micro, short, ckpt, prec) for _, length, ckpt, prec in points if short < min(length, DATA_TRACE_CAP)}
    return sorted(out)


def build_estimator(request: SearchRequest, timeout_s: float) -> tuple[Estimator | None, str]:
    """The estimator's fake-tensor trace of the model (a subprocess), or None with the reason it is unavailable."""
    started = time.monotonic()
    try:
        labels = request.job.max_target_length if request.job is not None else None
        lora = request.job.lora if request.job is not None else None
        traced = trace(
            request.model,
            data_points(request) or trace_points(request.space),
            timeout_s=timeout_s,
            label_length=labels,
            lora=lora,
        )
    except (TunerError, RuntimeError, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        return None, f"memory estimate unavailable ({reason}); probing without it"
    took = time.monotonic() - started
    longest = max((p.max_length for p in traced.points), default=0)
    beyond = max(request.space.max_length) > longest
    extrapolated = f"; inputs longer than {longest:,} tokens extrapolated by the fitted length curve" if beyond else ""
    return Estimator(
        traced, world_size=request.world_size, global_batch=request.global_batch
    ), f"memory estimate traced in {took:.0f}s ({traced.param_count:,} params{extrapolated})"


def stage_order(estimator: Estimator, request: SearchRequest) -> dict[int, int] | None:
    """The ZeRO stages ordered by memory need for this model, world size and space (tuner.memory.estimator), or None
    when no single order holds; the frontier then compares configs across stages too (Frontier(stage_need=...))."""
    tr = estimator.trace
    return zero_stage_need(
        tr.param_count, request.world_size, list(request.space.configs()), tr.largest_param, tr.trainable_count
    )
