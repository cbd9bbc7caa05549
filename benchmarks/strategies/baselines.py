"""Full grid (in the recorder's order) and random search (a seeded permutation): probe everything, keep the best
measured stable config."""

from __future__ import annotations

from benchmarks.table import Env, OutOfBudget, Tracker


def grid(env: Env) -> None:
    _walk(env, env.table.configs())


def random_search(env: Env) -> None:
    configs = env.table.configs()
    env.rng.shuffle(configs)
    _walk(env, configs)


def _walk(env: Env, configs: list) -> None:
    seen = Tracker(env)
    for knobs in configs:
        try:
            result = env.probe(knobs)
        except OutOfBudget:
            return
        seen.see(knobs, result)
