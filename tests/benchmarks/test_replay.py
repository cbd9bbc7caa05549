"""The replay on a recorded table of real probes: every strategy probes only recorded configs, is charged recorded
seconds, sees recorded outcomes, and the metrics are consistent. No timing asserts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.replay import main, run_one, summarize
from benchmarks.strategies import EXTRA, STRATEGIES
from benchmarks.table import Env, Table
from tuner.job.space import knobs_key

TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "tables" / "tiny-1rank.json"


@pytest.fixture(scope="module")
def table() -> Table:
    if not TABLE.exists():
        pytest.fail(f"recorded table {TABLE} is missing; record it with benchmarks/record.py (see BENCHMARKS.md)")
    return Table.load(TABLE)


def test_table_is_a_real_recording(table: Table) -> None:
    assert len(table.entries) >= 8
    assert all(len(e.repeats) >= 2 for e in table.entries.values())
    statuses = {r["status"] for e in table.entries.values() for r in e.repeats}
    assert "ok" in statuses and "oom" in statuses  # the budget puts part of the grid out of memory
    assert table.best > 0 and any(e.stable for e in table.entries.values())
    for e in table.entries.values():
        for r in e.repeats:
            assert r["probe_seconds"] > 0 and r["result"]["status"] == r["status"]


ALL = {**STRATEGIES, **EXTRA}


@pytest.mark.parametrize("name", list(ALL))
def test_strategy_respects_the_table(table: Table, name: str) -> None:
    env = Env(table=table, seed=3, budget_s=1.5 * table.grid_seconds)
    ALL[name](env)
    assert env.probes, "every strategy probes at least once"
    charged = 0.0
    for key, i, status, seconds in env.probes:
        entry = table.entries[key]  # only recorded configs are probed
        rep = entry.repeats[i]
        assert status == rep["status"]
        setup = rep.get("setup_s") or 0.0
        assert seconds >= min(rep["probe_seconds"], setup) - 1e-9
        charged += seconds
    assert env.clock == pytest.approx(charged + env.overhead_s) and env.clock <= env.budget_s
    clocks = [c for c, _ in env.timeline]
    assert clocks == sorted(clocks)
    for _, key in env.timeline:
        assert key is None or key in table.entries
    stats = run_one(table, ALL[name], seed=3)
    assert 0.0 <= stats.final <= 1.0 and all(0.0 <= v <= 1.0 for v in stats.at.values())
    if stats.seconds_to_1pct is not None:
        assert stats.seconds_to_1pct <= stats.seconds


def test_grid_probes_every_config_once(table: Table) -> None:
    env = Env(table=table, seed=0, budget_s=math.inf)
    STRATEGIES["grid"](env)
    assert sorted(k for k, *_ in env.probes) == sorted(table.entries)


def test_batch_size_finders_only_move_the_micro_batch(table: Table) -> None:
    for name in ("hf-x0.5", "hf-x0.9", "lightning-power", "lightning-binsearch"):
        env = Env(table=table, seed=1, budget_s=math.inf)
        STRATEGIES[name](env)
        probed = [table.entries[k].knobs for k, *_ in env.probes]
        rest = {json.dumps({**p.model_dump(), "micro_batch_size": 0}, sort_keys=True) for p in probed}
        assert len(rest) == 1, name
        assert len({p.micro_batch_size for p in probed}) == len(probed), name  # no micro batch probed twice
    env = Env(table=table, seed=1, budget_s=math.inf)
    STRATEGIES["hf-x0.5"](env)
    micros = [table.entries[k].knobs.micro_batch_size for k, *_ in env.probes]
    assert micros == sorted(micros, reverse=True)  # halving only goes down
    for _key, _, status, _ in env.probes[:-1]:
        assert status == "oom"  # it stops at the first batch that does not OOM


def test_summary_and_command_line(table: Table, tmp_path: Path) -> None:
    runs = [run_one(table, STRATEGIES["random"], s) for s in range(3)]
    s = summarize(table, runs)
    assert s["runs"] == 3 and 0 <= s["unstable_picks"] <= 3 and 0.0 <= s["final"] <= 1.0
    out = tmp_path / "replay.json"
    assert main([str(TABLE), "--seeds", "2", "--strategies", "grid,hf-x0.5,ds-autotune", "--json", str(out)]) == 0
    data = json.loads(out.read_text())[table.name]
    assert set(data["results"]) == {"grid", "hf-x0.5", "ds-autotune"}
    assert data["table"]["configs"] == len(table.entries)
    assert data["frontier"]["default_inferred"] >= 0
    assert knobs_key(table.configs()[0]) in table.entries
