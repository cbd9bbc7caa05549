"""DeepSpeed-Autotuning-style: ZeRO stages in increasing order; per stage a binary search for the largest micro batch
that runs, then the throughput of up to 3 micro batches at and below it (``num_tuning_micro_batch_sizes``); stop when
a stage gains < 5% over the best so far. Other knobs stay at the user's config (autotuning does not touch max_length or
checkpointing). Picks the best measured throughput among runs that finished (no headroom check, like DeepSpeed)."""

from __future__ import annotations

from benchmarks.strategies.user_start import micro_ladder
from benchmarks.table import Env, OutOfBudget
from trials.contract import Knobs

TUNING_MICRO_BATCHES = 3
MIN_GAIN = 0.05


def ds_autotune(env: Env) -> None:
    stages = sorted({k.zero_stage for k in env.table.configs() if k.engine == "deepspeed"})
    best: tuple[float, Knobs] | None = None
    try:
        for stage in stages:
            ladder = micro_ladder(env, zero_stage=stage)
            stage_best = _stage_best(env, ladder) if ladder else None
            if stage_best is None:
                continue
            previous = best[0] if best else 0.0
            if best is None or stage_best[0] > best[0]:
                best = stage_best
                env.pick(stage_best[1])
            if previous and stage_best[0] < (1 + MIN_GAIN) * previous:
                return
    except OutOfBudget:
        return


def _stage_best(env: Env, ladder: list[Knobs]) -> tuple[float, Knobs] | None:
    """One stage: a binary search for the largest micro batch that runs, then up to TUNING_MICRO_BATCHES at and
    below it; the best throughput measured there (None when nothing ran)."""
    measured: dict[int, float | None] = {}

    def run(i: int) -> bool:
        knobs = ladder[i]
        result = env.probe(knobs)
        ok = result.status == "ok"
        measured[i] = env.table.objective.of(result, knobs.max_length) if ok else None
        return ok

    lo, hi, top = 0, len(ladder) - 1, -1
    while lo <= hi:  # the largest micro batch that runs
        mid = (lo + hi) // 2
        if run(mid):
            top, lo = mid, mid + 1
        else:
            hi = mid - 1
    for i in range(top, max(top - TUNING_MICRO_BATCHES, -1), -1):
        if i not in measured:
            run(i)
    return max(((v, ladder[i]) for i, v in measured.items() if v is not None), key=lambda t: t[0], default=None)
