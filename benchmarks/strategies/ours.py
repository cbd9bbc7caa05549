"""Ours: tuner.search.strategy.Strategy as `tuner search` drives it, on an in-memory Optuna study with the table as the
probe and probe-seconds as the clock. The opening at the plainest config, then the guide (tuner.search.guide: a
throughput model fitted to the measured probes, constrained expected improvement), the feasibility frontier (ZeRO stages
ordered by tuner.memory.estimator.zero_stage_need when the estimate is on), the memory estimate from the trace `tuner
search` runs for this space (tuner.memory.tracing.trace_points; its recorded seconds are charged before the first
probe), both built by tuner.session.memory as a search builds them, and short->confirm finalists. Confirm probes draw
a fresh recorded repeat, charged setup + measuring time x (confirm steps / short steps). The pick is Strategy.best()
(confirmed finalists first, on a lower confidence bound)."""

from __future__ import annotations

import optuna

from benchmarks.table import Env, OutOfBudget
from trials.contract import Knobs
from tuner.search.sampling import make_sampler
from tuner.search.schedule import Schedule
from tuner.session.memory import MemoryModel
from tuner.session.session import start_strategy


def ours(env: Env, use_estimator: bool = True, guide: bool = True, charge_trace: bool = True) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t = env.table
    schedule = Schedule(guide=guide)
    request = t.search_request(schedule, seed=env.seed)
    memory = MemoryModel()
    if use_estimator:  # the trace `tuner search` runs before its first probe, charged its recorded seconds
        found = t.search_memory(request)
        if found is None:
            raise ValueError(f"table {t.name} has no search_trace: rerun its record command to add it")
        memory, trace_s = found
        try:
            env.charge(trace_s if charge_trace else 0.0)
        except OutOfBudget:
            return
    study = optuna.create_study(direction="maximize", sampler=make_sampler(env.seed))
    strategy = start_strategy(study, request, memory)  # as the driver's: the estimator, the ZeRO-ordering frontier
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


def ours_default(env: Env) -> None:
    """What `tuner search` does at these budgets: the memory estimate is on by default only for budgets of 10 minutes or
    more (tuner.memory.tracing.ESTIMATE_AUTO_MIN_BUDGET_S), and every recorded grid costs less than that. So no trace:
    the guide's P(stable) comes from a model of the measured peaks, ZeRO stages are unordered in the frontier."""
    ours(env, use_estimator=False)


def ours_with_estimate(env: Env) -> None:
    """`tuner search --estimate`: the trace first (its recorded seconds charged), then as ``ours``."""
    ours(env, use_estimator=True)


def ours_with_free_estimate(env: Env) -> None:
    """Not a search anyone runs: ``ours+estimate`` with the trace charged nothing, what the estimate is worth apart
    from its cost (the bound for a trace run beside the first probes: fake tensors on the CPU while a GPU probes)."""
    ours(env, use_estimator=True, charge_trace=False)


def ours_tpe(env: Env) -> None:
    """The ablation of the guide: after the opening bisection, TPE (with OOM constraints) proposes, as before the
    guide existed (``Schedule(guide=False)``); no estimate, like ``ours``."""
    ours(env, use_estimator=False, guide=False)
