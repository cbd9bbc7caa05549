"""The TRL recipe tables (issue 39, BENCHMARKS.md "TRL recipes: SFT and DPO tables"): real recordings of an SFT recipe
(padded / BFD-packed x full / LoRA) and a DPO recipe (reference model / precompute_ref_log_probs / PEFT, the adapter
disabled as the reference) on builtin:tiny-llama and a 3.5M-parameter shape of it, recorded with TRL 1.16.0 beside
tuner so each probe ran TRL's fused LM head. Each table's stored job is the one its recipe gives (benchmarks.
record_job), the table has a wall (rows that fit and rows that run out of memory), the uncalibrated estimate is within
the causal tables' target against every measured peak and puts every recorded OOM above the headroom, and strategies
replay it within its rules. Recorded data, no timing asserts."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.record_job import recorded_job
from benchmarks.replay import estimator_error, phase_errors
from tests.helpers.recorded_tables import load, replays_within_its_rules
from trials.contract import JobSettings

INPUTS = Path(__file__).resolve().parents[2] / "benchmarks" / "inputs"
#: table -> the recipe it ran
SFT = {f"trl-sft{s}-1rank": f"trl-sft{s}.yaml" for s in ("", "-packed", "-lora", "-packed-lora")}
DPO = {f"trl-dpo{s}-{n}rank": f"trl-dpo{s}.yaml" for s in ("", "-precomputed", "-peft") for n in (1, 2)}
#: the same recipes on a larger Llama shape (3.5M parameters: the backbone and the optimizer weigh beside TRL's head)
MID = {f"trl-{r}-mid-1rank": f"trl-{r}.yaml" for r in ("sft", "sft-lora", "dpo", "dpo-precomputed", "dpo-peft")}
TABLES = {**SFT, **DPO, **MID}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_a_trl_table_ran_its_recipe_with_trls_head(name: str) -> None:
    table = load(name)
    assert table.raw["model"]["source"] == "builtin:tiny-llama" and table.tracker_version == 2
    assert table.raw["commands"] and all(TABLES[name] in c for c in table.raw["commands"])
    stored = JobSettings.model_validate(table.raw["job"])
    assert stored.trl_head is not None and stored.trl_head.version == "1.16.0"  # recorded with TRL beside tuner
    job = recorded_job(table.model, table.space.max_length, INPUTS / TABLES[name])
    assert stored.model_copy(update={"trl_head": None}) == job.model_copy(update={"trl_head": None})
    assert (stored.dpo is not None) == name.startswith("trl-dpo")
    assert (stored.padding_free == "bfd") == ("-packed" in name)
    assert (stored.lora is not None) == ("-lora" in name or "-peft" in name)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_a_trl_tables_estimate_is_on_target_and_draws_its_wall(name: str) -> None:
    table = load(name)
    statuses = [r["status"] for e in table.entries.values() for r in e.repeats]
    assert "ok" in statuses and "oom" in statuses  # a wall: rows that fit and rows that run out
    err = estimator_error(table)
    assert err is not None and err["n"] == statuses.count("ok")
    assert err["median_abs"] <= 0.03 and err["max_abs"] <= 0.10, err
    assert set(phase_errors(table)) == {"train"}  # the recipes do not evaluate
    est = table.estimator()
    assert est is not None
    limit = table.headroom * table.device_memory
    for e in table.entries.values():
        if any(r["status"] == "oom" for r in e.repeats):
            assert est.predict(e.knobs).raw > limit, e.knobs


@pytest.mark.parametrize("strategy", ["ours", "ours+estimate", "grid"])
@pytest.mark.parametrize("name", ["trl-sft-packed-lora-1rank", "trl-dpo-2rank"])
def test_strategies_replay_a_trl_table(name: str, strategy: str) -> None:
    replays_within_its_rules(name, strategy, "full")
