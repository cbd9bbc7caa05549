"""Lightning's ``BatchSizeFinder`` / ``Tuner.scale_batch_size``: from ``init_val`` (2) double the batch until it OOMs
(``power``), then (``binsearch``) bisect between the last success and the failure. Picks the largest batch that ran;
like HF it does not look at headroom. Bisection points snap to recorded micro batches."""

from __future__ import annotations

from benchmarks.strategies.user_start import micro_ladder
from benchmarks.table import Env, OutOfBudget


def _scale(env: Env, binsearch: bool) -> None:
    ladder = micro_ladder(env)
    micros = [k.micro_batch_size for k in ladder]
    by_micro = {k.micro_batch_size: k for k in ladder}
    start = 2 if 2 in by_micro else micros[0]
    ok_micro: int | None = None
    fail_micro: int | None = None
    m = start
    try:
        while m in by_micro:
            result = env.probe(by_micro[m])
            if result.status != "ok":
                fail_micro = m
                break
            ok_micro = m
            env.pick(by_micro[m])
            if m * 2 not in by_micro:
                break
            m *= 2
        if binsearch and ok_micro is not None and fail_micro is not None:
            lo, hi = ok_micro, fail_micro
            while True:
                between = [x for x in micros if lo < x < hi]
                if not between:
                    break
                mid = between[len(between) // 2]
                result = env.probe(by_micro[mid])
                if result.status == "ok":
                    lo = mid
                    env.pick(by_micro[mid])
                else:
                    hi = mid
    except OutOfBudget:
        return


def lightning_power(env: Env) -> None:
    _scale(env, binsearch=False)


def lightning_binsearch(env: Env) -> None:
    _scale(env, binsearch=True)
