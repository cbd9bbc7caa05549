"""Each transformers release's fill of WarmupLR's "auto" (tuner.interop.trainer_fill), the baseline import that fills
as the user's release does, the fix the exports carry for it and the --changes lines that say why (issue 30, point 2).
The fills are checked against the releases themselves in test_trainer_releases.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from trials.contract import Knobs
from tuner.interop.baseline import parse_baseline
from tuner.interop.export import UserFiles, deepspeed_export, hf_export
from tuner.interop.export.changes import best_changes
from tuner.interop.trainer_fill import TrainerFix, apply_fixes, trainer_fill, trainer_fixes
from tuner.records import Fidelity

SEED = Path(__file__).resolve().parents[2] / "data" / "seed"
DS = json.loads((SEED / "ds_config.json").read_text())  # WarmupLR, "warmup_num_steps": "auto"
ARGS = {"per_device_train_batch_size": 2, "bf16": True, "learning_rate": 2e-5, "deepspeed": DS}  # no warmup: 0


@pytest.mark.parametrize(
    ("version", "clamps", "ratio_field"),
    [("4.57.3", False, True), ("5.0.0", False, False), ("5.17.0", False, False), ("5.18.0", True, False)],
)
def test_each_release_has_its_rule(version: str, clamps: bool, ratio_field: bool) -> None:
    fill = trainer_fill(version)
    assert (fill.version, fill.clamps_warmup, fill.warmup_ratio_field) == (version, clamps, ratio_field)


@pytest.mark.parametrize(
    ("version", "args", "steps", "filled"),
    [
        ("5.17.0", {}, None, 0),  # the default warmup_steps 0, unclamped
        ("5.18.0", {}, None, 1),  # clamped with max(1, ...)
        ("5.25.0", {"warmup_steps": 0}, 1000, 1),
        ("4.57.3", {}, None, 0),
        ("4.57.3", {"warmup_steps": 0, "warmup_ratio": 0.0}, 1000, 0),
        ("5.17.0", {"warmup_steps": 7}, None, 7),
        ("4.57.3", {"warmup_steps": 7, "warmup_ratio": 0.5}, 1000, 7),  # steps win over the ratio
        ("4.57.3", {"warmup_ratio": 0.1}, 1000, 100),
        ("5.17.0", {"warmup_steps": 0.25}, 1000, 250),  # 5.x: below 1 is the ratio
        ("5.17.0", {"warmup_steps": 0.001}, 10, 1),  # ceil
        ("5.17.0", {"warmup_steps": 0.25}, None, None),  # a ratio of an unknown number of steps: >= 1, not known
        ("5.17.0", {"warmup_steps": 0.0}, None, 0),  # a zero ratio is 0 whatever the steps
    ],
)
def test_the_warmup_each_release_fills(version: str, args: dict[str, Any], steps: int | None, filled: int) -> None:
    assert trainer_fill(version).warmup(args, steps) == filled


def test_an_unknown_version_reads_as_the_newest_rules_and_none_as_this_hosts() -> None:
    assert trainer_fill("nightly").clamps_warmup is True
    import transformers

    assert trainer_fill(None).version == transformers.__version__


def test_the_fix_is_warmup_one_in_both_files_where_their_trainer_fills_zero() -> None:
    fixes = trainer_fixes(DS, ARGS, trainer_fill("5.17.0"))
    assert [(f.file, f.key, f.old, f.runs, f.new) for f in fixes] == [
        ("deepspeed", "scheduler.params.warmup_num_steps", "auto", 0, 1),
        ("training args", "warmup_steps", None, None, 1),
    ]
    assert "transformers 5.17.0 fills warmup_num_steps 'auto' with warmup_steps unclamped" in fixes[0].why
    assert "deepspeed >= 0.19.3 refuses it" in fixes[0].why
    assert trainer_fixes(DS, ARGS, trainer_fill("5.18.0")) == []  # their Trainer fills 1 itself
    assert trainer_fixes(DS, {**ARGS, "warmup_steps": 10}, trainer_fill("5.17.0")) == []
    assert trainer_fixes({"optimizer": DS["optimizer"]}, ARGS, trainer_fill("5.17.0")) == []  # no scheduler
    # an explicit 0 is refused by DeepSpeed whatever the release: fixed too (their DeepSpeed file alone: only there)
    explicit = {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}}
    assert [(f.file, f.new) for f in trainer_fixes(explicit, None, trainer_fill("5.25.0"))] == [("deepspeed", 1)]
    fixes = [TrainerFix.from_dict(f.to_dict()) for f in fixes]  # stored as JSON in the study definition
    fixed = apply_fixes({"scheduler": {"params": {"warmup_num_steps": 0}}}, fixes, "deepspeed")
    assert fixed["scheduler"]["params"]["warmup_num_steps"] == 1
    assert apply_fixes(fixed, fixes, "deepspeed", undo=True)["scheduler"]["params"]["warmup_num_steps"] == 0


def test_the_baseline_is_filled_as_their_release_fills_it() -> None:
    old = parse_baseline(DS, ARGS, world_size=1, max_length=32, transformers_version="5.17.0")
    assert old.ds_config["scheduler"]["params"]["warmup_num_steps"] == 0  # what their Trainer hands DeepSpeed
    assert old.probe_source()["scheduler"]["params"]["warmup_num_steps"] == 1  # what the search's probes run
    assert old.transformers == "5.17.0" and [f["key"] for f in old.fixes] == [
        "scheduler.params.warmup_num_steps",
        "warmup_steps",
    ]
    assert (
        "scheduler.params.warmup_num_steps: 'auto' -> 0 (from the training args, as transformers 5.17.0 fills it)"
        in (old.notes)
    )
    new = parse_baseline(DS, ARGS, world_size=1, max_length=32, transformers_version="5.25.0")
    assert new.ds_config["scheduler"]["params"]["warmup_num_steps"] == 1 and new.fixes == []
    assert new.probe_source() == new.ds_config
    four = parse_baseline(DS, ARGS, world_size=1, max_length=32, transformers_version="4.57.3")
    assert [(f.key, f.runs, f.new) for f in four.trainer_fixes()] == [
        (f.key, f.runs, f.new) for f in old.trainer_fixes()
    ]
    assert (
        "transformers 4.57.3 fills warmup_num_steps 'auto' with warmup_steps (else warmup_ratio)"
        in four.fixes[0]["why"]
    )


def test_the_search_probes_the_fixed_config_and_trial_0_as_their_trainer_runs_it() -> None:
    from tuner.job.space import default_space
    from tuner.search.request import build_request
    from tuner.search.setup import SearchSetup

    def load(world: int | None, max_length: int) -> Any:
        return parse_baseline(DS, ARGS, world_size=world, max_length=max_length, transformers_version="5.17.0")

    request = build_request(
        study_name="s", storage="sqlite://", model=_tiny(), space=default_space(), budget_s=60, baseline=load
    )
    assert request.definition()["trainer"]["transformers"] == "5.17.0"
    setup = SearchSetup.of(request)
    assert request.baseline is not None
    knobs = Knobs.model_validate(request.baseline.model_dump())
    trial0 = setup.probe_config(knobs, Fidelity.BASELINE, 60)
    other = setup.probe_config(knobs, Fidelity.SHORT, 60)
    assert trial0.deepspeed is not None and other.deepspeed is not None
    assert trial0.deepspeed["scheduler"]["params"]["warmup_num_steps"] == 0
    assert other.deepspeed["scheduler"]["params"]["warmup_num_steps"] == 1


def _tiny() -> Any:
    from tuner.job.model_source import resolve_model

    return resolve_model("builtin:tiny-t5")


@dataclass
class Best:
    knobs: dict[str, Any]
    config: dict[str, Any]
    fingerprints: list[dict[str, Any]] = field(default_factory=list)


def _exports(version: str) -> tuple[dict[str, Any], dict[str, Any]]:
    base = parse_baseline(DS, ARGS, world_size=1, max_length=32, transformers_version="5.17.0")
    kw: dict[str, Any] = {
        "world_size": 1,
        "gradient_accumulation_steps": 4,
        "baseline": base.probe_source(),
        "files": UserFiles.of(base.files()),
        "transformers_version": version,
    }
    knobs = {**base.knobs, "micro_batch_size": 1}
    return deepspeed_export(knobs, **kw), hf_export(knobs, **kw)


def test_the_exports_for_such_a_host_carry_warmup_one_explicitly() -> None:
    ds, hf = _exports("5.17.0")
    assert ds["scheduler"]["params"]["warmup_num_steps"] == 1  # explicit, not "auto"
    assert ds["scheduler"]["params"]["warmup_max_lr"] == "auto"  # the rest of their "auto" stays
    assert hf["warmup_steps"] == 1 and hf["deepspeed"]["scheduler"]["params"]["warmup_num_steps"] == 1
    # for a Trainer that clamps, their files stay as they were: it fills 1 itself, what the probes ran
    ds, hf = _exports("5.25.0")
    assert ds["scheduler"]["params"]["warmup_num_steps"] == "auto" and "warmup_steps" not in hf


def test_changes_list_the_fix_with_why() -> None:
    base = parse_baseline(DS, ARGS, world_size=1, max_length=32, transformers_version="5.17.0")
    best = Best({**base.knobs, "micro_batch_size": 1}, {"world_size": 1, "gradient_accumulation_steps": 4})
    definition = {
        "baseline_files": base.files(),
        "baseline_source": base.probe_source(),
        "trainer": base.trainer(),
    }
    lines = best_changes(best, definition, None).lines()  # the study's release: 5.17.0
    fixed = [line for line in lines if "for your Trainer:" in line]
    assert [line.split(" (for your Trainer:")[0] for line in fixed] == [
        "training args: warmup_steps: (unset) -> 1",
        "deepspeed: scheduler.params.warmup_num_steps: 'auto' -> 1",
    ]
    assert "transformers 5.17.0 fills warmup_num_steps 'auto' with warmup_steps unclamped" in fixed[0]
    assert lines[-1].startswith("training args written for transformers 5.17.0")
    later = best_changes(best, definition, None, "5.25.0").lines()  # --transformers-version 5.25.0
    assert not [line for line in later if "warmup" in line]
