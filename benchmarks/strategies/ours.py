"""Ours: helper B's tuner.strategy.Strategy — TPE with OOM constraints, the feasibility frontier (ZeRO stages ordered
by tuner.estimator.zero_stage_need when the estimate is on, as tuner.search does), the memory estimate (from the
table's fake-tensor trace, calibrated on every measured peak) and short->confirm finalists — on an in-memory Optuna
study, driven like tuner/search.py drives it but with the table as the probe and probe-seconds as the clock. Confirm probes draw a fresh recorded repeat, charged setup + measuring time x (confirm steps / short steps).
The pick is Strategy.best() (confirmed finalists first, on a lower confidence bound)."""

from __future__ import annotations

import optuna

from benchmarks.table import Env, OutOfBudget
from trials.contract import Knobs
from tuner.estimator import zero_stage_need
from tuner.frontier import Frontier
from tuner.strategy import Schedule, Strategy, make_sampler


def ours(env: Env, use_estimator: bool = True, guide: bool = True) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t = env.table
    schedule = Schedule(guide=guide)
    estimator = t.estimator() if use_estimator else None
    study = optuna.create_study(direction="maximize", sampler=make_sampler(env.seed))
    strategy = Strategy(
        study=study,
        space=t.space,
        model=t.model,
        world_size=t.world_size,
        global_batch=t.global_batch,
        objective=t.objective,
        device_memory=t.device_memory,
        headroom=t.headroom,
        schedule=schedule,
        estimator=estimator,
        seed=env.seed,
    )
    if estimator is not None:  # as tuner.search.Search.attach_estimator: the frontier then orders ZeRO stages
        need = zero_stage_need(estimator.trace.param_count, t.world_size, list(t.space.configs()),
                               estimator.trace.largest_param)
        if need:
            strategy.use_frontier(Frontier(stage_need=need))
    confirm_factor = sum(schedule.confirm) / sum(schedule.short)
    while True:
        proposal = strategy.propose(env.seconds_left)
        strategy.drain()
        if proposal is None:
            return
        factor = confirm_factor if proposal.fidelity == "confirm" else 1.0
        try:
            result = env.probe(proposal.config.knobs, cost_factor=factor)
        except OutOfBudget:
            return
        strategy.observe(proposal, result)
        best = strategy.best()
        env.pick(Knobs.model_validate(best.knobs) if best is not None else None)


def ours_no_estimator(env: Env) -> None:
    """`tuner search --no-estimate` (the default for budgets under 10 minutes): no memory estimate, ZeRO stages
    unordered in the frontier."""
    ours(env, use_estimator=False)


def ours_tpe(env: Env) -> None:
    """The ablation of the guide: after the opening bisection, TPE (with OOM constraints) proposes, as before the
    guide existed (``Schedule(guide=False)``)."""
    ours(env, guide=False)
