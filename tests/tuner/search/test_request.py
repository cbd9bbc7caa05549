"""tuner.search.request.build_request: the one check-and-derive step `tuner search` and ``POST /studies`` share.

Pure: parsed values in, a SearchRequest (or one clear error) out. The last tests show the CLI's option parsing and the
API's body parsing arrive at the same study definition through it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trials.contract import Knobs, ModelSpec
from tuner.errors import BaselineError, ConfigError
from tuner.interop.baseline import Baseline
from tuner.job.space import default_space, space_from_dict
from tuner.search.request import build_request
from tuner.search.schedule import Schedule


def _request(**over: Any):
    args: dict[str, Any] = {
        "study_name": "s",
        "storage": "sqlite://",
        "model": ModelSpec(),
        "space": default_space(),
        "budget_s": 60.0,
    }
    return build_request(**{**args, **over})


def _baseline(micro: int, world: int | None = None, batch: int | None = None) -> Baseline:
    knobs = Knobs(micro_batch_size=micro, max_length=128, zero_stage=2).model_dump()
    return Baseline(knobs, batch, world, 1, {"zero_optimization": {"stage": 2}})


def test_defaults_world_one_and_the_smallest_global_batch_every_micro_batch_reaches() -> None:
    request = _request()
    assert request.world_size == 1
    assert request.global_batch == 32  # lcm(1, 2, 4, 8, 16, 32) x 1
    assert request.space.micro_batch_size == [1, 2, 4, 8, 16, 32]
    assert request.baseline is None and request.baseline_source is None
    assert request.schedule == Schedule()


def test_the_space_keeps_only_micro_batches_that_reach_the_global_batch() -> None:
    request = _request(world_size=2, global_batch=8)
    assert request.space.micro_batch_size == [1, 2, 4]
    with pytest.raises(ConfigError, match="global batch 3 cannot be reached"):
        _request(world_size=2, global_batch=3)


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"headroom": 0.0}, "headroom 0.0 must be in (0, 1]"),
        ({"headroom": 1.5}, "headroom 1.5 must be in (0, 1]"),
        ({"world_size": 0}, "world_size 0 must be at least 1"),
        ({"n_trials": 0}, "n_trials 0 must be at least 1"),
        ({"global_batch": 0}, "global_batch 0 must be at least 1"),
    ],
)
def test_numbers_are_checked_and_named_as_the_caller_spells_them(over: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as generic:
        _request(**over)
    assert words in str(generic.value)
    with pytest.raises(ConfigError) as spelled:
        _request(**over, option=lambda name: "--" + name.replace("_", "-"))
    assert "--" + words.replace("_", "-") in str(spelled.value)


def test_numbers_are_checked_before_the_baseline_is_parsed() -> None:
    def never(world: int | None, max_length: int) -> Baseline:
        raise AssertionError("parsed the baseline before checking the numbers")

    with pytest.raises(ConfigError, match="world_size 0"):
        _request(world_size=0, baseline=never)


def test_the_baseline_gives_world_size_global_batch_and_its_deepspeed_source() -> None:
    seen: list[tuple[int | None, int]] = []

    def load(world: int | None, max_length: int) -> Baseline:
        seen.append((world, max_length))
        return _baseline(micro=2, world=4, batch=16)

    request = _request(baseline=load)
    assert seen == [(None, 128)]  # no world size given; the space's longest max_length
    assert (request.world_size, request.global_batch) == (4, 16)
    assert request.baseline == Knobs(micro_batch_size=2, max_length=128, zero_stage=2)
    assert request.baseline_source == {"zero_optimization": {"stage": 2}}
    assert request.space.micro_batch_size == [1, 2, 4]
    with pytest.raises(ConfigError, match=r"^global_batch 8 differs from your files' global batch 16 \(micro 2 x "):
        _request(baseline=load, world_size=2, global_batch=8)  # theirs, unless a change is asked for
    explicit = _request(baseline=load, world_size=2, global_batch=8, change_global_batch=True)
    assert (explicit.world_size, explicit.global_batch, explicit.files_global_batch) == (2, 8, 16)
    assert explicit.definition()["files_global_batch"] == 16 and "files_global_batch" not in request.definition()


def test_a_baseline_micro_batch_that_cannot_reach_the_global_batch_names_the_option() -> None:
    def load(world: int | None, max_length: int) -> Baseline:
        return _baseline(micro=4)

    with pytest.raises(BaselineError, match=r"baseline micro batch 4 x world size 1 cannot reach global batch 2; set "):
        _request(
            baseline=load,
            global_batch=2,
            space=default_space().restrict(micro_batch_size=[1, 2]),
            change_global_batch=True,
        )
    with pytest.raises(BaselineError, match="set --global-batch to a multiple"):
        _request(
            baseline=load,
            global_batch=2,
            space=default_space().restrict(micro_batch_size=[1, 2]),
            option=lambda name: "--" + name.replace("_", "-"),
            change_global_batch=True,
        )


def test_varying_max_length_with_lengths_counts_retained_tokens() -> None:
    space = space_from_dict({**default_space().model_dump(mode="json"), "max_length": [64, 128]}, "space")
    request = _request(space=space, lengths=[10, 100, 200], space_listed={"max_length"})  # a file naming lengths
    assert request.objective.kind == "retained_tokens_per_s"
    assert request.objective.lengths == (10, 100, 200)
    assert request.job_changes == ("max_length",) and request.job is not None and request.job.max_length == 128
    fixed = _request(space=space, lengths=[10, 100, 200])  # the same space, not from a file: the job's length holds
    assert fixed.space.max_length == [128] and fixed.objective.kind == "samples_per_s" and not fixed.job_changes


def test_cli_options_and_an_api_body_build_the_same_definition(tmp_path: Path) -> None:
    """The same settings through `tuner search`'s parsing and through POST /studies' parsing: one definition."""
    from api.definitions import definition
    from api.schemas import StudyCreate
    from tuner.session.options import CLI, SearchOptions, prepare_request

    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    options = SearchOptions(
        budget="2h",
        storage="sqlite://",
        study="same",
        world_size=2,
        device_memory="1GiB",
        headroom=0.8,
        baseline=tmp_path / "ds.json",
        model="builtin:tiny-t5",
        given=frozenset({"model"}),  # typed: with files the model is named (the default is only without them)
    )
    cli, _ = prepare_request(options, "sqlite://", CLI)
    body = StudyCreate(name="same", world_size=2, device_memory="1GiB", headroom=0.8, budget_s=7200, baseline=ds)
    assert definition(body, "sqlite://") == cli.definition()
    assert cli.global_batch == 8  # the baseline's: 2 x 2 x world size 2


def test_the_cli_spells_its_options_in_errors() -> None:
    from tuner.session.options import cli_option

    assert cli_option("global_batch") == "--global-batch"
    assert cli_option("headroom") == "--headroom"


def test_a_resumed_study_holds_its_stored_data() -> None:
    """The data summary is compared like any definition field the user set; a study stored before it: not held."""
    from tuner.job.length_summary import DataOrigin, LengthSummary
    from tuner.job.lengths import SampleLengths
    from tuner.search.request import check_resume

    def data(source: str, inputs: list[int]) -> dict:
        return {"data": LengthSummary.of(SampleLengths.of(inputs), DataOrigin(source)).to_json()}

    check_resume("s", data("a.jsonl", [5, 9]), data("a.jsonl", [5, 9]), {"data"})  # the same data: resumes
    check_resume("s", {}, data("a.jsonl", [5, 9]), {"data"})  # stored before the summary: nothing to hold it to
    with pytest.raises(ConfigError, match=r"created with a different data \(2 samples of a.jsonl\); drop the option"):
        check_resume("s", data("a.jsonl", [5, 9]), data("b.jsonl", [5, 9, 700]), {"data"})
