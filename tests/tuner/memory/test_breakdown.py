"""The estimate by phase and part (tuner.memory.breakdown / states.PhaseBuffers / traced / solve), on hand-made
traces: which ZeRO buffer each phase holds, the eval phases, the named allocations scaled to the config's shape, and
the --solve bisection."""

from __future__ import annotations

from trials.contract import Knobs
from tuner.memory import solve
from tuner.memory.breakdown import (
    ACTIVATIONS,
    EVAL_FORWARD,
    FORWARD_BACKWARD,
    GENERATE,
    GENERATION_CACHE,
    GRADIENTS,
    OPTIMIZER_STEP,
    ZERO_BUFFERS,
)
from tuner.memory.estimator import Estimator, Trace, TracePoint
from tuner.memory.trace import TracedAllocation

P = 1_000_000
BUCKET = 1000


def kn(**kw: object) -> Knobs:
    base: dict[str, object] = {
        "micro_batch_size": 2,
        "max_length": 100,
        "reduce_bucket_size": BUCKET,
        "allgather_bucket_size": BUCKET,
    }
    base.update(kw)
    return Knobs.model_validate(base)


def point(length: int, micro: int = 2, **kw: object) -> TracePoint:
    per_sample = 1000 * length + 10 * length * length  # a*len + b*len^2
    fields: dict[str, object] = {
        "micro_batch_size": micro,
        "max_length": length,
        "activation_bytes": micro * per_sample,
        "resident_activation_bytes": micro * per_sample + 4 * P,
        "step_temp_bytes": 4 * P,
    }
    fields.update(kw)
    return TracePoint.model_validate(fields)


def estimator(*points: TracePoint, world: int = 2, batch: int | None = 8) -> Estimator:
    tr = Trace(param_count=P, param_bytes=4 * P, largest_param=10_000, points=list(points))
    return Estimator(trace=tr, world_size=world, global_batch=batch)


def test_zero1_gathers_in_the_step_only_and_zero2_builds_its_grad_partition() -> None:
    est = estimator(point(100))
    z1 = est.breakdown(kn(zero_stage=1)).worst
    fb, step = z1.phase(FORWARD_BACKWARD), z1.phase(OPTIMIZER_STEP)
    assert fb.part(ZERO_BUFFERS) == 4 * BUCKET  # the fp32 reduce bucket; no all-gather during backward
    assert step.part(ZERO_BUFFERS) == 4 * BUCKET + 4 * BUCKET  # + the all-gather chunk of the updated partitions
    z2 = est.breakdown(kn(zero_stage=2)).worst
    assert z2.phase(OPTIMIZER_STEP).part(ZERO_BUFFERS) == 4 * BUCKET + 4 * BUCKET + 4 * P // 2  # + fp32 partition
    # ZeRO-2 reduces grads into fixed buffers as the backward goes: no full grads offset the activations' peak, so
    # its backward takes the trace's grads-resident peak (the grads in flight), accumulating or not; ZeRO-1 keeps
    # full grads and takes it only when accumulating
    assert z2.phase(FORWARD_BACKWARD).part(ACTIVATIONS) == point(100).resident_activation_bytes
    assert z1.phase(FORWARD_BACKWARD).part(ACTIVATIONS) == point(100).resident_activation_bytes
    one_step = estimator(point(100), batch=4)  # micro 2 x 2 ranks: no accumulation
    assert one_step.breakdown(kn(zero_stage=2)).worst.phase(FORWARD_BACKWARD).part(ACTIVATIONS) == (
        point(100).resident_activation_bytes
    )
    assert one_step.breakdown(kn(zero_stage=1)).worst.phase(FORWARD_BACKWARD).part(ACTIVATIONS) == (
        point(100).activation_bytes
    )
    off = est.breakdown(kn(zero_stage=1, offload_optimizer=True)).worst
    assert off.phase(FORWARD_BACKWARD).part(ZERO_BUFFERS) == 4 * BUCKET + 4 * 10_000  # + the grad staging buffer
    assert est.predict(kn(zero_stage=1)).raw == max(fb.total, step.total)


def test_zero2s_grad_partition_is_on_the_device_in_the_backward_only_when_made_before_its_peak() -> None:
    accumulating, one_step = estimator(point(100), batch=8), estimator(point(100), batch=4)
    partition, whole = 4 * P // 2, 2 * P  # a reduce bucket that takes every grad reduces only in the epilogue
    for est, bucket, off, live in (
        (accumulating, whole, False, True),  # the earlier micro-step's partition, held by param.grad views
        (one_step, BUCKET, False, True),  # a mid-backward reduce builds it
        (one_step, whole, False, False),
        (accumulating, BUCKET, True, False),  # offload: the grads go to the host
    ):
        rank = est.breakdown(kn(zero_stage=2, offload_optimizer=off, reduce_bucket_size=bucket)).worst
        assert rank.phase(FORWARD_BACKWARD).part(GRADIENTS) == (partition if live else 0), (bucket, off)
        assert rank.phase(OPTIMIZER_STEP).part(GRADIENTS) == partition
    note = one_step.breakdown(kn(zero_stage=2, reduce_bucket_size=whole)).worst.phase(FORWARD_BACKWARD).parts[1].note
    assert "first reduce" in note
    # ZeRO-1 (full grads) and ZeRO-3 (its persistent grad_partitions_flat_buffer) keep theirs in every phase
    for stage, grads in ((1, 4 * P), (3, 4 * P // 2)):
        k = kn(zero_stage=stage, reduce_bucket_size=whole)
        assert one_step.breakdown(k).worst.phase(FORWARD_BACKWARD).part(GRADIENTS) == grads


def test_eval_phases_from_an_evaluating_trace() -> None:
    evaluated = point(
        100,
        eval_batch_size=4,
        eval_bytes=3_000_000,
        generate_bytes=5_000_000,
        generate_cache_bytes=2_000_000,
        largest={"generate": [TracedAllocation(op="bmm.default", shape=[4, 8, 100, 100], dtype="float32", nbytes=1)]},
    )
    est = estimator(evaluated)
    plain = est.breakdown(kn(zero_stage=0)).worst
    assert [p.phase for p in plain.phases] == [FORWARD_BACKWARD, OPTIMIZER_STEP]  # the config does not evaluate
    rank = est.breakdown(kn(zero_stage=0, eval_batch_size=4, generate=True)).worst
    assert [p.phase for p in rank.phases] == [FORWARD_BACKWARD, OPTIMIZER_STEP, EVAL_FORWARD, GENERATE]
    gen = rank.phase(GENERATE)
    assert gen.part(GRADIENTS) == 0 and gen.part(GENERATION_CACHE) == 2_000_000
    assert gen.part(ACTIVATIONS) == 3_000_000  # the decode's peak less its cache
    assert rank.phase(EVAL_FORWARD).part(ACTIVATIONS) == 3_000_000
    # twice the eval batch: the eval phases scale with it (one traced length: linear)
    double = est.breakdown(kn(zero_stage=0, eval_batch_size=8, generate=True)).worst
    assert double.phase(EVAL_FORWARD).part(ACTIVATIONS) == 6_000_000
    named = next(p for p in double.phase(GENERATE).parts if p.largest).largest[0]
    assert named.shape == (8, 8, 100, 100) and named.nbytes == 8 * 8 * 100 * 100 * 4 and named.traced_at == (4, 100)


def test_longer_configs_extrapolate_and_name_scaled_allocations() -> None:
    softmax = TracedAllocation(op="_safe_softmax.default", shape=[2, 16, 320, 320], dtype="float32", nbytes=1)
    est = estimator(point(320, largest={FORWARD_BACKWARD: [softmax]}), point(640), batch=4)  # one micro-step
    long = est.breakdown(kn(zero_stage=1, max_length=6352)).worst.phase(FORWARD_BACKWARD)
    assert long.part(ACTIVATIONS) == 2 * (1000 * 6352 + 10 * 6352 * 6352)  # a*len + b*len^2 fitted exactly
    named = long.parts[-1].largest[0]
    assert named.shape == (2, 16, 6352, 6352) and named.nbytes == 2 * 16 * 6352 * 6352 * 4  # the seed's 4.81 GiB
    assert "scaled from micro 2 x length 640" not in named.describe()  # the longest point carrying names: 320
    assert "scaled from micro 2 x length 320" in named.describe()


def test_solve_finds_the_edge_of_the_verdict() -> None:
    est = estimator(point(100), point(200))
    k = kn(zero_stage=0)
    capacity = est.predict(k.model_copy(update={"max_length": 1500})).calibrated + 1
    n = solve.max_length(est, k, capacity, 0.0, 1 << 20)
    assert n is not None and n >= 1500
    assert solve.fits(est, k.model_copy(update={"max_length": n}), capacity, 0.0)
    assert not solve.fits(est, k.model_copy(update={"max_length": n + 1}), capacity, 0.0)
    m = solve.max_micro_batch(est, k, capacity, 0.0, 1 << 16)
    assert m is not None and not solve.fits(est, k.model_copy(update={"micro_batch_size": m + 1}), capacity, 0.0)
    assert solve.max_length(est, k, 1, 0.0, 1 << 20) is None  # nothing fits in one byte


def test_autocasts_weight_copies_are_charged_once_and_only_to_the_torch_engine() -> None:
    """A mixed-precision trace holds autocast's bf16 copies of the weights in every phase's bytes (a constant): scaled
    per sample it grew with the eval batch (seed case: 17 GiB at eval batch 50 for a 1.5 GB copy); now it is taken
    out before scaling, kept for the plain torch engine (autocast over fp32 weights) and dropped for DeepSpeed's
    half-precision module."""
    copies = 1_000_000
    evaluated = point(
        100,
        precision="bf16",
        eval_batch_size=1,
        eval_bytes=copies + 30_000,
        generate_bytes=copies + 50_000,
        generate_cache_bytes=20_000,
        autocast_cache_bytes=copies,
        activation_bytes=copies + 70_000,
        resident_activation_bytes=copies + 70_000,
    )
    est = estimator(evaluated)
    ds = est.breakdown(kn(zero_stage=0, precision="bf16", eval_batch_size=50, generate=True)).worst
    assert ds.phase(EVAL_FORWARD).part(ACTIVATIONS) == 50 * 30_000  # per sample, no weight copies
    assert ds.phase(GENERATE).part(ACTIVATIONS) == 50 * (50_000 - 20_000)
    assert ds.phase(FORWARD_BACKWARD).part(ACTIVATIONS) == 70_000
    torch_engine = est.breakdown(kn(engine="torch", precision="bf16", eval_batch_size=50, generate=True)).worst
    assert torch_engine.phase(EVAL_FORWARD).part(ACTIVATIONS) == 50 * 30_000 + copies  # once, whatever the batch
    assert torch_engine.phase(FORWARD_BACKWARD).part(ACTIVATIONS) == 70_000 + copies
    assert "autocast" in next(p.note for p in torch_engine.phase(EVAL_FORWARD).parts if p.name == ACTIVATIONS)
