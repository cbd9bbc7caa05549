"""tuner.records.study: a study's definition as a typed record, built once by the storage from the stored JSON with its
invariants checked (RecordError naming the field), and what every face reads from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tuner.records import RecordError, StudyDefinition
from tuner.storage import Store


def stored(**values: Any) -> dict[str, Any]:
    return {
        "model": {"source": "builtin:tiny-t5", "overrides": {}},
        "job": None,
        "job_changes": ["max_length"],
        "space": {"micro_batch_size": [1, 2]},
        "world_size": 2,
        "global_batch": 8,
        "device_memory": None,
        "headroom": 0.8,
        "objective": {"kind": "samples_per_s"},
        "budget_s": 60.0,
        "baseline": None,
        "baseline_source": {"train_batch_size": "auto"},
        "baseline_files": None,
        "finalists": 2,
        **values,
    }


def test_the_stored_json_reads_as_fields_and_writes_back_the_same() -> None:
    d = StudyDefinition.from_json(stored(host={"gpu": "H100"}, later_key=[1]), "s")
    assert (d.world_size, d.global_batch, d.headroom, d.job_changes) == (2, 8, 0.8, ("max_length",))
    assert d.model_source == "builtin:tiny-t5" and d.host == {"gpu": "H100"}
    assert d.baseline_source == {"train_batch_size": "auto"}  # the user's document, kept as stored
    assert d.to_json() == stored(host={"gpu": "H100"}, later_key=[1])  # an unknown key survives


def test_an_older_study_reads_with_what_it_has() -> None:
    d = StudyDefinition.from_json({"model": "m"}, "old")
    assert d.model_source == "m" and d.world_size is None and d.headroom == 0.9 and d.job_changes == ()


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("world_size", 0, "world_size 0"),
        ("global_batch", 2.5, "global_batch 2.5"),
        ("device_memory", "lots", "device_memory 'lots'"),
        ("headroom", 1.5, "headroom 1.5"),
        ("space", [1, 2], "space is list"),
        ("job_changes", "max_length", "job_changes"),
        ("budget_s", -1, "budget_s -1"),
    ],
)
def test_a_broken_field_is_a_record_error_naming_study_and_field(field: str, value: Any, says: str) -> None:
    with pytest.raises(RecordError, match=f"study definition s: {says}"):
        StudyDefinition.from_json(stored(**{field: value}), "s")


def test_the_storage_hands_out_the_typed_record_once(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_study("s", stored())
    d = store.require_definition("s")
    assert isinstance(d, StudyDefinition) and d.global_batch == 8
    (listed,) = store.studies()
    assert listed.name == "s" and listed.definition == d and listed.created_by == "cli"
    assert store.study("s") == listed and store.study("nope") is None and store.definition("nope") is None


def test_resuming_a_definition_that_lacks_what_a_search_needs_is_one_line() -> None:
    from trials.contract import ModelSpec
    from tuner.job.objective import objective_for
    from tuner.job.space import default_space
    from tuner.search.request import SearchRequest, request_from_definition

    space = default_space()
    base = SearchRequest("s", "sqlite://", ModelSpec(), space, 1, 8, objective_for(space.max_length), 60.0)
    with pytest.raises(RecordError, match="lacks the model, space, world size or global batch"):
        request_from_definition(base, StudyDefinition.from_json({"model": "m"}, "s"))
    resumed = request_from_definition(base, StudyDefinition.from_json(stored(space=space.model_dump(mode="json"))))
    assert (resumed.world_size, resumed.global_batch, resumed.headroom) == (2, 8, 0.8)
