"""How configs are drawn: Optuna's TPE sampler for the search, and the plainest config used to open it."""

from __future__ import annotations

import warnings
from typing import Any

import optuna

from trials.contract import BUCKET_KNOBS, Knobs


class PlainSuggester:
    """A Suggester choosing the lowest-overhead value of every knob, at a given micro batch and the longest length."""

    def __init__(self, micro: int) -> None:
        self.micro = micro

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        values = list(choices)
        if name == "micro_batch_size":
            return self.micro
        if name == "max_length":
            return max(values)
        if name == "zero_stage":
            return min(values)
        if name == "engine":
            return "deepspeed" if "deepspeed" in values else values[0]
        if name in ("gradient_checkpointing", "offload_optimizer", "offload_param", "overlap_comm", "generate"):
            return False if False in values else values[0]
        if name in BUCKET_KNOBS:
            sized = [v for v in values if v is not None]
            return min(sized) if sized else None
        return values[0]


def fixed_params(knobs: Knobs) -> dict[str, Any]:
    return {k: v for k, v in knobs.model_dump(mode="json").items()}


def make_sampler(seed: int | None = None, n_startup_trials: int = 6) -> optuna.samplers.BaseSampler:
    """TPE over the conditional space; constraints from OOM-pruned trials steer it away from infeasible configs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=n_startup_trials, multivariate=True, group=True, constant_liar=True
        )
