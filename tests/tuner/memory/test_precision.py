"""Which precision mode the estimate reads (issue 32): DeepSpeed bf16/fp16 casts the module, the plain torch engine
runs fp32 weights under autocast, fp32 is one mode; a trace recorded before the field serves both, as before."""

from __future__ import annotations

import pytest

from trials.contract import Knobs
from tuner.errors import ConfigError
from tuner.memory.estimator import Estimator
from tuner.memory.precision import traced_precision
from tuner.memory.trace import Trace, TracePoint, trace_at

MiB = 1 << 20


def _point(cast: bool | None, act: int, copies: int | None = None) -> TracePoint:
    return TracePoint(
        micro_batch_size=2,
        max_length=64,
        precision="bf16",
        cast_module=cast,
        activation_bytes=act,
        resident_activation_bytes=act,
        autocast_cache_bytes=copies,
    )


def _trace(*points: TracePoint) -> Trace:
    return Trace(param_count=1000, param_bytes=4000, largest_param=100, points=list(points))


def test_each_engine_reads_its_own_modes_points() -> None:
    tr = _trace(_point(False, 30 * MiB, copies=5 * MiB), _point(True, 10 * MiB))
    ds = Knobs(micro_batch_size=2, max_length=64, precision="bf16", zero_stage=0)
    torch_engine = ds.model_copy(update={"engine": "torch"})
    est = Estimator(tr, global_batch=2)
    assert est.backward_activations(ds) == 10 * MiB  # the half module's trace, no weight copies
    assert est.backward_activations(torch_engine) == 30 * MiB  # autocast's, its copies charged once
    assert trace_at(ds) == (2, 64, False, "bf16", True) and trace_at(torch_engine)[-1] is False
    assert trace_at(ds.model_copy(update={"precision": "fp32"}))[-1] is False  # fp32: one mode


def test_a_trace_without_the_engines_mode_says_to_trace_it() -> None:
    ds = Knobs(micro_batch_size=2, max_length=64, precision="bf16")
    with pytest.raises(ConfigError, match="module cast, as DeepSpeed runs it"):
        Estimator(_trace(_point(False, 30 * MiB)), global_batch=2).backward_activations(ds)


def test_a_trace_recorded_before_the_field_reads_as_before() -> None:
    old = _trace(_point(None, 30 * MiB, copies=5 * MiB))  # autocast, the only mode then
    ds = Knobs(micro_batch_size=2, max_length=64, precision="bf16")
    assert Estimator(old, global_batch=2).backward_activations(ds) == 25 * MiB  # copies out, as before


def test_the_precision_line_names_the_mode_and_why() -> None:
    def k(**kw: object) -> Knobs:
        return Knobs.model_validate({"micro_batch_size": 1, "max_length": 8, **kw})

    ds = traced_precision(k(precision="bf16")).line()
    assert ds.startswith("precision traced: bf16, the module cast to bf16") and "DeepSpeed" in ds
    assert "fp32 master weights and Adam state" in ds and "loss scaler" not in ds
    fp16 = traced_precision(k(precision="fp16")).line()
    assert "the module cast to fp16" in fp16 and "a loss scaler" in fp16
    torch_line = traced_precision(k(precision="bf16", engine="torch", zero_stage=0)).line()
    assert "bf16 autocast over fp32 weights" in torch_line and "plain torch engine" in torch_line
    assert traced_precision(k()).line().startswith("precision traced: fp32")
