"""Plain Optuna TPE over the same space, without the frontier, the estimator or constraints: an OOM is a FAILED trial,
a repeated config reuses its first measurement for free. Picks the best measured stable config."""

from __future__ import annotations

import warnings

import optuna
from optuna.trial import TrialState

from benchmarks.table import Env, OutOfBudget, Tracker
from tuner.job.space import knobs_key


def plain_tpe(env: Env) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=env.seed, multivariate=True, group=True)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    seen = Tracker(env)
    cache: dict[str, float | None] = {}
    space = env.table.space
    asks = 0
    while len(cache) < len(env.table.entries) and asks < 20 * len(env.table.entries):
        asks += 1
        trial = study.ask()
        knobs = space.sample(trial)
        key = knobs_key(knobs)
        if key not in env.table.entries:  # outside the recorded grid (e.g. an unreachable micro batch)
            study.tell(trial, state=TrialState.FAIL)
            continue
        if key not in cache:
            try:
                result = env.probe(knobs)
            except OutOfBudget:
                study.tell(trial, state=TrialState.FAIL)
                return
            cache[key] = seen.see(knobs, result)
            if cache[key] is None and result.status == "ok":
                cache[key] = 0.0  # ran, but above the headroom: a worthless config to TPE
        value = cache[key]
        if value is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, value)
