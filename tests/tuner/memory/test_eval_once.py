"""Evaluation runs the model in eval mode, where gradient checkpointing is off: `tuner explain` traces the eval
phases at its un-checkpointed points only (tuner.memory.trace.trace ``evaluate_checkpointed=False``), and the estimate
of a checkpointed config reads its eval phases from them (issue 40 §2: a minute less per length on flan-t5-large)."""

from __future__ import annotations

from trials.contract import Knobs
from tuner.memory.breakdown import EVAL_FORWARD, GENERATE
from tuner.memory.estimator import Estimator
from tuner.memory.trace import Trace, TracePoint

P = 1_000_000


def _point(length: int, ckpt: bool, evaluated: bool) -> TracePoint:
    ev = {"eval_batch_size": 1, "eval_bytes": 1000 * length, "generate_bytes": 3000 * length}
    return TracePoint(
        micro_batch_size=2,
        max_length=length,
        gradient_checkpointing=ckpt,
        activation_bytes=(300 if ckpt else 1000) * length,
        **(ev | {"generate_cache_bytes": 100 * length} if evaluated else {}),
    )


def test_a_checkpointed_config_reads_its_eval_phases_from_the_points_without_checkpointing():
    points = [_point(n, ckpt, evaluated=not ckpt) for n in (64, 128) for ckpt in (False, True)]
    est = Estimator(trace=Trace(param_count=P, param_bytes=4 * P, largest_param=10_000, points=points), world_size=1)
    k = Knobs(micro_batch_size=2, max_length=128, eval_batch_size=4, generate=True)
    plain = {p.phase: p.total for p in est.breakdown(k).worst.phases}
    ckpt = {p.phase: p.total for p in est.breakdown(k.model_copy(update={"gradient_checkpointing": True})).worst.phases}
    assert plain[EVAL_FORWARD] == ckpt[EVAL_FORWARD] and plain[GENERATE] == ckpt[GENERATE]
    assert ckpt[EVAL_FORWARD] > 0
