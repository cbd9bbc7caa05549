"""The memory estimate a search starts with: a fake-tensor trace of the user's model (tuner.memory.tracing) made
into the estimator and, where one order of the ZeRO stages by memory need holds for the space, the frontier that
compares configs across stages. `tuner search`, ``tuner.tune``, the dry run and the benchmarks' replay of our strategy
all build it here: the replay from the trace recorded with its table, the others from a fresh trace."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from trials.contract import FsdpSettings
from tuner.memory.estimator import Estimator, Evaluation, Trace
from tuner.memory.frontier import Frontier
from tuner.memory.trace import TraceTrainer, trace_trainer
from tuner.memory.tracing import (
    DATA_TRACE_CAP,
    ESTIMATE_AUTO_MIN_BUDGET_S,
    TraceShapes,
    build_estimator,
    stage_order,
)
from tuner.search.request import SearchRequest


@dataclass(frozen=True)
class MemoryModel:
    """What the strategy starts from: the estimator (None: probing without it) and the frontier ordering ZeRO
    stages (None: stages are not compared); ``note`` says how the trace went, or why there is none."""

    estimator: Estimator | None = None
    frontier: Frontier | None = None
    note: str | None = None


def shapes(request: SearchRequest) -> TraceShapes:
    """What the trace covers for this request: its model, space, world size and global batch, and the job's label
    length, LoRA adapters and evaluation (as every probe of the job runs them)."""
    job = request.job
    return TraceShapes(
        model=request.model,
        space=request.space,
        world_size=request.world_size,
        global_batch=request.global_batch,
        label_length=job.max_target_length if job is not None else None,
        lora=job.lora if job is not None else None,
        evaluation=evaluation(request),
        fsdp=FsdpSettings.model_validate(request.fsdp) if request.fsdp is not None else None,
        trainer=job_trainer(request),
        **_data_shapes(request),
    )


def job_trainer(request: SearchRequest) -> TraceTrainer | None:
    """The job's training args as its probes run them, for the trace (tuner.memory.trace.trace_trainer)."""
    job = request.job
    if job is None:
        return None
    held = job.eval_held_batches if job.evaluates else 0
    return trace_trainer(
        job.trainer_args,
        job.seq2seq_args,
        held,
        request.baseline_source,
        bool(job.compile),
        job.dpo,
        padding_free=job.padding_free,
        trl_head=job.trl_head,
    )


def evaluation(request: SearchRequest) -> Evaluation | None:
    """The job's evaluation as the trace runs it: its eval batch (the space's largest micro batch when the job
    does not name one), generate at the generation length (default: the label length) over its beams."""
    job = request.job
    if job is None or not job.evaluates:
        return None
    return Evaluation(
        eval_batch_size=job.eval_batch_size or max(request.space.micro_batch_size),
        generate=job.generate,
        generation_max_length=job.generation_max_length or job.max_target_length,
        num_beams=job.num_beams,
    )


def _data_shapes(request: SearchRequest) -> dict[str, Any]:
    """With the user's data: its median input length traced too, no input longer than DATA_TRACE_CAP, and batches
    with the collator's padding where it pads (DataJob.pads)."""
    if request.data is None:
        return {}
    from tuner.job.lengths import Quantiles

    p50 = Quantiles.of(request.data.lengths.input).p50
    return {"extra_lengths": (p50,), "length_cap": DATA_TRACE_CAP, "padded": request.data.pads}


def wanted(request: SearchRequest, estimate: bool | None) -> bool:
    """``estimate`` as asked; None: for budgets of ESTIMATE_AUTO_MIN_BUDGET_S (10 minutes) or more."""
    return estimate if estimate is not None else request.budget_s >= ESTIMATE_AUTO_MIN_BUDGET_S


def traced(request: SearchRequest, estimate: bool | None) -> MemoryModel:
    """Traces the model when the estimate is ``wanted`` (a subprocess, at most 20% of the budget or 10 minutes)."""
    if not wanted(request, estimate):
        return MemoryModel()
    estimator, note = build_estimator(shapes(request), timeout_s=min(600.0, 0.2 * request.budget_s))
    if estimator is None:
        return MemoryModel(note=note)
    return MemoryModel(estimator, _frontier(estimator, request), note)


def baseline_trace(request: SearchRequest, estimate: bool | None) -> Trace | None:
    """A trace of the baseline's shapes alone, kept with a study that has data for the baseline's crash line, when the
    search runs without the estimate by default (a budget under 10 minutes; issue 33 §11): the crash line is the
    first thing a user with data comes for. None with no data or no baseline, the estimate asked for (its trace is
    kept instead) or turned off (``--no-estimate``), or when the trace fails (the search goes on without)."""
    b = request.baseline
    if estimate is not None or request.data is None or b is None or wanted(request, estimate):
        return None
    space = request.space.model_copy(
        update={
            "micro_batch_size": [b.micro_batch_size],
            "max_length": [b.max_length],
            "gradient_checkpointing": [b.gradient_checkpointing],
            "precision": [b.precision],
        }
    )
    estimator, _ = build_estimator(replace(shapes(request), space=space), timeout_s=min(600.0, 0.2 * request.budget_s))
    return None if estimator is None else estimator.trace


def recorded(trace: Trace, request: SearchRequest) -> MemoryModel:
    """From a trace made earlier (a benchmark table's): the same estimator and frontier as ``traced`` gives."""
    estimator = Estimator(trace=trace, world_size=request.world_size, global_batch=request.global_batch)
    return MemoryModel(estimator, _frontier(estimator, request))


def _frontier(estimator: Estimator, request: SearchRequest) -> Frontier | None:
    order = stage_order(estimator, shapes(request))
    return Frontier(stage_need=order) if order else None
