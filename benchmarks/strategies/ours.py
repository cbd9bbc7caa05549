"""Ours: helper B's tuner.strategy.Strategy — TPE with OOM constraints, the feasibility frontier, the memory estimate
(from the table's fake-tensor trace, calibrated on every measured peak) and short->confirm finalists — on an in-memory
Optuna study, driven exactly like tuner/search.py drives it but with the table as the probe and probe-seconds as the
clock. Confirm probes draw a fresh recorded repeat, charged setup + measuring time x (confirm steps / short steps).
The pick is Strategy.best() (confirmed finalists first, on a lower confidence bound)."""

from __future__ import annotations

import optuna

from benchmarks.table import Env, OutOfBudget
from trials.contract import Knobs
from tuner.estimator import zero_stage_need
from tuner.frontier import Frontier
from tuner.strategy import Schedule, Strategy, make_sampler


def ours(env: Env, use_estimator: bool = True, stage_order: bool = False) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t = env.table
    schedule = Schedule()
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
        estimator=t.estimator() if use_estimator else None,
        seed=env.seed,
    )
    if stage_order:  # what wiring tuner.estimator.zero_stage_need into the Strategy's frontier would give
        est = t.estimator()
        need = zero_stage_need(est.trace.param_count, t.world_size, t.configs()) if est else None
        strategy.frontier = Frontier(stage_need=need)
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
    ours(env, use_estimator=False)


def ours_stage_order(env: Env) -> None:
    """NOT what `tuner search` runs today: ours with the frontier ordering ZeRO stages by estimator.zero_stage_need."""
    ours(env, stage_order=True)
