"""Hugging Face ``auto_find_batch_size`` (accelerate's ``find_executable_batch_size``): start at the user's batch, on
an OOM retry at ``batch * factor`` (x0.5 in older accelerate, x0.9 in newer), stop at the first batch that runs. It
knows nothing of headroom: a run that does not OOM is taken, even at 99% of device memory.

On the table only micro batches that reach the fixed global batch exist, so a shrunk batch snaps down to the largest
recorded micro batch at or below it (x0.9 then walks the same ladder as x0.5 on a power-of-two grid)."""

from __future__ import annotations

from benchmarks.strategies.user_start import micro_ladder
from benchmarks.table import Env, OutOfBudget


def _halving(env: Env, factor: float) -> None:
    ladder = micro_ladder(env)
    by_micro = {k.micro_batch_size: k for k in ladder}
    batch = max(by_micro)
    while batch >= 1:
        fits = [m for m in by_micro if m <= batch]
        if not fits:
            return
        knobs = by_micro[max(fits)]
        try:
            result = env.probe(knobs)
        except OutOfBudget:
            return
        if result.status != "oom":
            if result.status == "ok":
                env.pick(knobs)
            return
        batch = int(knobs.micro_batch_size * factor)


def hf_halving(env: Env) -> None:
    _halving(env, 0.5)


def hf_x09(env: Env) -> None:
    _halving(env, 0.9)
