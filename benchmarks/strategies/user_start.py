"""The "user's config" the batch-size finders start from: the longest max_length, the lowest ZeRO stage present, no
gradient checkpointing (the Trainer defaults; under FSDP2 accelerate's: reshard after forward, no offload), the other
knobs at the grid's first values. Only the micro batch moves."""

from __future__ import annotations

from benchmarks.table import Env
from trials.contract import Knobs


def micro_ladder(env: Env, zero_stage: int | None = None) -> list[Knobs]:
    """The table's configs of the user's setup (optionally at another ZeRO stage), one per micro batch, ascending."""
    configs = env.table.configs()
    length = max(k.max_length for k in configs)
    stage = min(k.zero_stage for k in configs) if zero_stage is None else zero_stage
    first = configs[0]
    out: dict[int, Knobs] = {}
    for k in configs:
        if k.max_length != length or k.zero_stage != stage or k.gradient_checkpointing:
            continue
        if not k.reshard_after_forward or k.offload_params:
            continue
        same_rest = all(
            getattr(k, f) == getattr(first, f)
            for f in ("engine", "precision", "alloc_conf", "eval_batch_size", "generate")
        )
        if same_rest and k.micro_batch_size not in out:
            out[k.micro_batch_size] = k
    return [out[m] for m in sorted(out)]
