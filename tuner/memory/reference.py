"""A DPO job's parts of the estimate (tuner.memory.estimator): the frozen reference model's parameters on a rank, as
TRL 1.16's DPOTrainer holds them (trials.dpo): in fp32 beside the plain torch engine (its autocast runs the
precision), cast to the engine's bf16 / fp16 under DeepSpeed (``prepare_deepspeed`` initialises it with the policy's
precision), sharded over the ranks under ZeRO-3 only (stage 0 otherwise), where it gathers its own layers for its
forward as the policy does (``tuner.memory.states.zero3_gathered``; TRL's hidden-size overrides for it are dotted
keys DeepSpeed does not read, so the policy's bucket settings hold). The pairs' activations are in the traced
activations (2 x micro rows); the reference's no-grad forward runs inside the traced step. Pure."""

from __future__ import annotations

from trials.contract import DS_DEFAULT_BUCKET, Knobs
from tuner.memory.breakdown import REFERENCE, Part
from tuner.memory.states import zero3_gathered
from tuner.memory.trace import Trace

PAIRS_NOTE = "DPO's pairs: 2 x micro rows (chosen + rejected)"  # in the activations' note (explain reads it)


def reference_bytes(trace: Trace, knobs: Knobs, world_size: int) -> int:
    """The reference model's parameter bytes on one rank (0: no reference model in the step)."""
    count = trace.reference_count or 0
    if not count or knobs.engine == "fsdp2":  # FSDP2's DPO probe refuses a reference model (trials.dpo)
        return 0
    deepspeed = knobs.engine == "deepspeed"
    per = 2 if deepspeed and knobs.precision in ("bf16", "fp16") else 4
    if deepspeed and knobs.zero_stage == 3:  # its partition, and its gathered layer (2-rank ZeRO-3 probe: exact)
        allgather = knobs.allgather_bucket_size or DS_DEFAULT_BUCKET
        gathered = zero3_gathered(per, count, world_size, trace.largest_param, allgather)
        return -(-count // world_size) * per + gathered
    return count * per


def reference_parts(trace: Trace, knobs: Knobs, world_size: int) -> tuple[Part, ...]:
    """The reference model's part of every phase (none without one)."""
    held = reference_bytes(trace, knobs, world_size)
    if not held:
        return ()
    zero3 = knobs.engine == "deepspeed" and knobs.zero_stage == 3
    where = "sharded, with its gathered layer (ZeRO-3)" if zero3 else "whole on every rank"
    dtype = "fp32" if knobs.engine == "torch" or knobs.precision == "fp32" else knobs.precision
    return (Part(REFERENCE, held, f"DPO's frozen reference model, {dtype}, {where}; its no-grad forward in the step"),)


def pairs_note(trace: Trace) -> str:
    """What the activations part says of a DPO job's rows."""
    return f"; {PAIRS_NOTE}" if trace.pairs else ""


def solve3(m: list[list[float]], v: list[float]) -> list[float]:
    """The 3 x 3 linear system ``m t = v`` (the estimator's calibration fit), by Gauss-Jordan with pivoting."""
    a = [[*row[:], v[i]] for i, row in enumerate(m)]
    for c in range(3):
        piv = max(range(c, 3), key=lambda r: abs(a[r][c]))
        a[c], a[piv] = a[piv], a[c]
        for r in range(3):
            if r != c and a[c][c]:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c], strict=False)]
    return [a[i][3] / a[i][i] if a[i][i] else 0.0 for i in range(3)]
