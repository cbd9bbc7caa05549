"""The memory estimate of a LoRA job: grads and optimizer states for the adapters only, the base weights once."""

from __future__ import annotations

from trials.contract import Knobs
from tuner.memory.estimator import Estimator, Trace, TracePoint, model_state_bytes


def kn(**over: object) -> Knobs:
    return Knobs.model_validate({"micro_batch_size": 4, "max_length": 64, **over})


def test_a_lora_job_pays_grads_and_optimizer_states_for_its_adapters_only() -> None:
    p, t = 1_100_048_384, 2_252_800  # a llama-1b-sized base, r 8 adapters on q_proj / v_proj
    for knobs in (kn(engine="torch"), kn(zero_stage=0, precision="bf16"), kn(zero_stage=2, precision="bf16")):
        full, lora = model_state_bytes(knobs, p), model_state_bytes(knobs, p, trainable=t)
        assert lora.params == full.params  # the base weights, once, at the job's precision
        assert (lora.grads, lora.optimizer) == (full.grads * t // p, full.optimizer * t // p)
        assert lora.total < 0.35 * full.total
    z3 = model_state_bytes(kn(zero_stage=3, precision="bf16"), p, world_size=4, trainable=t)
    assert (z3.params, z3.grads, z3.optimizer) == (2 * p // 4, 2 * t // 4, 12 * t // 4)


def test_the_estimator_reads_the_trainable_count_of_a_lora_trace() -> None:
    point = TracePoint(micro_batch_size=4, max_length=64, activation_bytes=1000)
    lora = Trace(param_count=1_000_000, trainable_count=10_000, param_bytes=4_000_000, largest_param=1, points=[point])
    full = lora.model_copy(update={"trainable_count": None})  # a trace from before LoRA jobs: everything trains
    knobs = kn(engine="torch")
    assert Estimator(lora).predict(knobs).raw == 4 * 1_000_000 + 12 * 10_000 + 1000
    assert Estimator(full).predict(knobs).raw == 16 * 1_000_000 + 1000
