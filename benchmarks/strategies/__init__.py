"""Search strategies replayed against a recorded table. Each is ``run(env: Env) -> None``: it probes through
``env.probe`` (which raises OutOfBudget when the budget is spent) and declares its pick through ``env.pick``."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.strategies.baselines import grid, random_search
from benchmarks.strategies.ds_autotune import ds_autotune
from benchmarks.strategies.hf_halving import hf_halving, hf_x09
from benchmarks.strategies.lightning import lightning_binsearch, lightning_power
from benchmarks.strategies.ours import ours_default, ours_tpe, ours_with_estimate, ours_with_free_estimate
from benchmarks.strategies.tpe import plain_tpe
from benchmarks.table import Env

STRATEGIES: dict[str, Callable[[Env], None]] = {
    "ours": ours_default,
    "grid": grid,
    "random": random_search,
    "tpe": plain_tpe,
    "hf-x0.5": hf_halving,
    "hf-x0.9": hf_x09,
    "lightning-power": lightning_power,
    "lightning-binsearch": lightning_binsearch,
    "ds-autotune": ds_autotune,
}
# not peers: ours with the memory trace (its seconds charged), and ours with TPE instead of the guide (ablations)
EXTRA: dict[str, Callable[[Env], None]] = {
    "ours+estimate": ours_with_estimate,
    "ours+free-estimate": ours_with_free_estimate,
    "ours-tpe": ours_tpe,
}
