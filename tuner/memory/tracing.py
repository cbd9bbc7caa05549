"""The memory estimate for a search: a fake-tensor trace of the user's model at a few shapes (memory.estimator).

It takes the shapes to trace (TraceShapes), built by its caller (tuner.session.memory) from the search's request:
memory sits below the search and knows nothing of it."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from trials.contract import FsdpSettings, LoraSpec, ModelSpec
from tuner.errors import TunerError
from tuner.job.space import Space
from tuner.memory.estimator import Estimator, Evaluation, accumulates, trace, zero_stage_need
from tuner.memory.precision import casts_module
from tuner.memory.trace import FsdpAt, TraceAt, TraceTrainer

ESTIMATE_AUTO_MIN_BUDGET_S = 600.0  # below this, tracing costs too large a share of the budget


@dataclass(frozen=True)
class TraceShapes:
    """What the estimate traces and is for: the model (with the job's LoRA adapters), the space whose shapes are
    traced, seq2seq labels at ``label_length`` (None: max_length), the world size and the global batch, and the
    job's evaluation (its eval forward and generate are traced at every point too)."""

    model: ModelSpec
    space: Space
    world_size: int
    global_batch: int | None = None
    label_length: int | None = None
    lora: LoraSpec | None = None
    evaluation: Evaluation | None = None  # the job's eval forward / generate (None: it does not evaluate)
    extra_lengths: tuple[int, ...] = ()  # more input lengths to trace (with data: its median), for the length curve
    length_cap: int | None = None  # no longer inputs traced; longer ones follow the fitted a*L + b*L^2
    padded: bool = False  # the batches carry the collator's padding (data whose samples differ in length)
    fsdp: FsdpSettings | None = None  # the user's FSDP2 settings (an FSDP2 baseline's), as its probes hold them
    trainer: TraceTrainer | None = None  # the job's training args as the probes run them (their optimizer ...)


#: with the user's data, the longest input length traced: a CPU fake-tensor trace of a large model at the data's
#: longest samples (6,000+ tokens) takes minutes; longer inputs follow the fitted a*L + b*L^2 (attention's L^2 term)
DATA_TRACE_CAP = 2048


def trace_points(space: Space) -> list[TraceAt]:
    """The smallest and largest micro batch per (max_length, checkpointing, precision, the precision mode of each of
    the space's engines): the estimator scales activations linearly in the micro batch and fits the length curve, so
    these few points cover the space."""
    micros = sorted({min(space.micro_batch_size), max(space.micro_batch_size)})
    modes = sorted({(prec, cast) for prec in space.precision for cast in _casts(space, prec)})
    return [
        (m, length, ckpt, prec, cast)
        for m in micros
        for length in space.max_length
        for ckpt in space.gradient_checkpointing
        for prec, cast in modes
    ]


def _casts(space: Space, precision: str) -> set[bool]:
    """The precision modes the space's engines run ``precision`` in (tuner.memory.precision)."""
    return {casts_module(engine, precision) for engine in space.engine}


def shape_points(shapes: TraceShapes) -> list[TraceAt]:
    """``trace_points`` of the space, its lengths at most ``length_cap``, plus each of ``extra_lengths`` shorter than
    that at the smallest micro batch, so the estimator fits how activations grow with length."""
    points = trace_points(shapes.space)
    if shapes.length_cap is None and not shapes.extra_lengths:
        return points
    cap = shapes.length_cap or max(p[1] for p in points)
    micro = min(p[0] for p in points)
    out = {(m, min(length, cap), ckpt, prec, cast) for m, length, ckpt, prec, cast in points}
    for n in shapes.extra_lengths:
        out |= {(micro, n, ckpt, prec, cast) for _, length, ckpt, prec, cast in points if n < min(length, cap)}
    return sorted(out)


def fsdp_points(shapes: TraceShapes) -> list[FsdpAt]:
    """The FSDP2 configs to trace when the space searches engine fsdp2 (tuner.memory.fsdp: its memory is traced per
    config): the smallest and largest micro batch at each (capped) length of the space's accumulating micro batches
    and of its others (``no_sync`` keeps whole unsharded grads between micro-steps: another kind of point, not a
    scaled one), every checkpointing, precision and FSDP2 knob of the space (HSDP: on a replica's ranks). fp16 is not
    traced (its grad scaler needs CUDA): those configs have no estimate and are probed."""
    space = shapes.space
    if "fsdp2" not in space.engine:
        return []
    lengths = sorted({min(n, shapes.length_cap or n) for n in space.max_length})
    out: set[FsdpAt] = set()
    by_accumulation: dict[bool, list[int]] = {}
    for micro in space.micro_batch_size:
        by_accumulation.setdefault(accumulates(shapes.global_batch, micro, shapes.world_size), []).append(micro)
    for acc, micros in by_accumulation.items():  # a point of each kind at both ends of its micro batches
        for micro, n, ckpt, prec, raf, off, rep in itertools.product(
            sorted({min(micros), max(micros)}),
            lengths,
            space.gradient_checkpointing,
            space.precision,
            space.reshard_after_forward,
            space.offload_params,
            space.dp_replicate_size,  # HSDP: traced on a replica's ranks (tuner.memory.trace.shard_world)
        ):
            if prec != "fp16":
                out.add((micro, n, ckpt, prec, raf, off, shapes.world_size // (rep or 1), acc))
    return sorted(out)


def build_estimator(shapes: TraceShapes, timeout_s: float) -> tuple[Estimator | None, str]:
    """The estimator's fake-tensor trace of the model (a subprocess), or None with the reason it is unavailable."""
    started = time.monotonic()
    try:
        traced = trace(
            shapes.model,
            shape_points(shapes),
            timeout_s=timeout_s,
            label_length=shapes.label_length,
            lora=shapes.lora,
            evaluation=shapes.evaluation,
            padded=shapes.padded,
            fsdp_points=fsdp_points(shapes),
            fsdp=shapes.fsdp,
            trainer=shapes.trainer,
        )
    except (TunerError, RuntimeError, OSError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        return None, f"memory estimate unavailable ({reason}); probing without it"
    took = time.monotonic() - started
    longest = max((p.max_length for p in traced.points), default=0)
    beyond = max(shapes.space.max_length) > longest
    extrapolated = f"; inputs longer than {longest:,} tokens extrapolated by the fitted length curve" if beyond else ""
    return Estimator(
        traced, world_size=shapes.world_size, global_batch=shapes.global_batch
    ), f"memory estimate traced in {took:.0f}s ({traced.param_count:,} params{extrapolated})"


def stage_order(estimator: Estimator, shapes: TraceShapes) -> dict[int, int] | None:
    """The ZeRO stages ordered by memory need for this model, world size and space (tuner.memory.estimator), or None
    when no single order holds; the frontier then compares configs across stages too (Frontier(stage_need=...))."""
    tr = estimator.trace
    return zero_stage_need(
        tr.param_count, shapes.world_size, list(shapes.space.configs()), tr.largest_param, tr.trainable_count
    )
