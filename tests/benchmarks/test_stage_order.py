"""The replay's frontier check orders ZeRO stages as a search does (tuner.session.memory -> tuner.memory.tracing.
stage_order): with the trace's largest parameter and, for a LoRA job, only the adapters' optimizer states. It used to
call zero_stage_need with the parameter count alone, so a LoRA job's order differed from production's."""

from __future__ import annotations

from pathlib import Path

from benchmarks.replay import frontier_soundness
from benchmarks.table import Table
from tuner.memory.estimator import Trace
from tuner.session.memory import recorded

TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "tables" / "t5-mid-2rank-offload.json"


def _lora_table() -> Table:
    """The recorded table with its trace read as a LoRA job's: 1% of the parameters train."""
    table = Table.load(TABLE)
    trace = dict(table.raw["trace"])
    trace["trainable_count"] = trace["param_count"] // 100
    table.raw["trace"] = trace
    return table


def test_the_replay_orders_stages_as_the_search_does_for_a_lora_job():
    table = _lora_table()
    production = recorded(Trace.model_validate(table.raw["trace"]), table.search_request()).frontier
    assert production is not None and production.stage_need is not None  # LoRA: one order holds for this space
    assert frontier_soundness(table)["stage_need"] == production.stage_need


def test_a_full_fine_tune_keeps_its_order():
    table = Table.load(TABLE)
    production = recorded(Trace.model_validate(table.raw["trace"]), table.search_request()).frontier
    assert frontier_soundness(table)["stage_need"] == (production.stage_need if production is not None else None)
