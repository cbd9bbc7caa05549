"""tuner.memory.reference: a DPO job's frozen reference model on a rank, as TRL's DPOTrainer holds it beside each
engine (fp32 beside plain torch, the engine's half precision under DeepSpeed, sharded under ZeRO-3 only)."""

from __future__ import annotations

from trials.contract import Knobs
from tuner.memory.breakdown import REFERENCE, PhaseEstimate, columns
from tuner.memory.reference import reference_bytes, reference_parts
from tuner.memory.trace import Trace

N = 1_000_000
TRACE = Trace(param_count=N, param_bytes=4 * N, largest_param=N // 10, reference_count=N, pairs=True)


def knobs(**kw: object) -> Knobs:
    return Knobs.model_validate({"micro_batch_size": 2, "max_length": 64, **kw})


def test_the_reference_is_fp32_beside_torch_half_under_deepspeed_and_sharded_only_by_zero3() -> None:
    assert reference_bytes(TRACE, knobs(engine="torch", precision="bf16"), 1) == 4 * N  # autocast over fp32
    assert reference_bytes(TRACE, knobs(engine="deepspeed", zero_stage=2, precision="bf16"), 4) == 2 * N  # stage 0
    # ZeRO-3: its partition and the layer it gathers for its forward (here the whole model: below the 5e8 bucket)
    assert reference_bytes(TRACE, knobs(engine="deepspeed", zero_stage=3, precision="bf16"), 4) == 2 * N // 4 + 2 * N
    assert reference_bytes(TRACE, knobs(engine="deepspeed", zero_stage=3), 1) == 4 * N  # one rank gathers nothing
    assert reference_bytes(TRACE, knobs(engine="deepspeed", zero_stage=1), 2) == 4 * N


def test_no_reference_model_no_part_and_no_column() -> None:
    plain = TRACE.model_copy(update={"reference_count": None})
    assert reference_parts(plain, knobs(engine="torch"), 1) == ()
    (part,) = reference_parts(TRACE, knobs(engine="torch"), 1)
    assert part.name == REFERENCE and "frozen reference model" in part.note
    assert REFERENCE in columns([PhaseEstimate("forward_backward", (part,))])
    assert REFERENCE not in columns([PhaseEstimate("forward_backward", ())])
