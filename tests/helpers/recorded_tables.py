"""The recorded tables the benchmark tests read (benchmarks/tables), and the one replay check every table family's
tests run: a strategy on a table (or its tight variant) probes only recorded configs, is charged what they recorded,
and ours never hands over an unstable config."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.replay import run_one
from benchmarks.strategies import EXTRA, STRATEGIES
from benchmarks.table import Env, Table
from benchmarks.tight import variant as tight_variant

TABLES = Path(__file__).resolve().parents[2] / "benchmarks" / "tables"
ALL = {**STRATEGIES, **EXTRA}


def load(name: str) -> Table:
    path = TABLES / f"{name}.json"
    if not path.exists():
        pytest.fail(f"recorded table {path} is missing; record it with benchmarks/record.py (see BENCHMARKS.md)")
    return Table.load(path)


def replays_within_its_rules(table_name: str, strategy: str, variant: str) -> None:
    table = tight_variant(load(table_name), variant)
    env = Env(table=table, seed=5, budget_s=1.5 * table.grid_seconds)
    ALL[strategy](env)
    assert env.probes and all(key in table.entries for key, *_ in env.probes)
    assert env.clock <= env.budget_s + 1e-9
    stats = run_one(table, ALL[strategy], seed=5)
    assert 0.0 <= stats.final <= 1.0
    if strategy in ("ours", "ours+estimate"):  # ours never hands over an unstable config
        assert not stats.unstable
    assert math.isfinite(stats.seconds)
