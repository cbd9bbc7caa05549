"""The settings of a search are declared once (tuner.declared: SearchOptions and JobFlags fields); `tuner search` and
`tuner estimate` options, tune()'s keywords and the POST /studies body are built from them, so none can drift."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import typer

import tuner
from api.schemas import StudyCreate
from tuner.cli.app import _register, app
from tuner.cli.estimate import ESTIMATE_OWN
from tuner.declared import API, ESTIMATE, SEARCH, TUNE, declared
from tuner.job.definition import JobFlags
from tuner.python_api import RUN_KEYWORDS
from tuner.session.options import SearchOptions


def _settings(face: str):
    return declared(SearchOptions, face) + declared(JobFlags, face)


def _options(name: str) -> dict[str, Any]:
    """The command's options as typer built them (its click command's parameters), by name."""
    _register()
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {p.name: p for p in command.params if p.param_type_name == "option"}


def test_every_job_flag_and_search_option_is_declared() -> None:
    for record in (SearchOptions, JobFlags):
        undeclared = [f.name for f in dataclasses.fields(record) if "tuner.setting" not in f.metadata]
        # job_flags: the job's own record; given: which settings were typed (provenance, not a setting)
        assert undeclared == (["job_flags", "given"] if record is SearchOptions else []), undeclared


def test_tuner_search_has_an_option_per_setting_with_its_help_and_spelling() -> None:
    options = _options("search")
    for d in _settings(SEARCH):
        option = options[d.name]
        assert option.help == d.spec.help and option.opts[0] == d.flag.split("/")[0], d.name
        assert option.required == d.required and (d.required or option.default == d.default), d.name
    assert set(options) - {d.name for d in _settings(SEARCH)} == {"dry_run"}  # its own, not a setting


def test_tuner_estimate_has_the_declared_job_settings_with_its_own_defaults() -> None:
    options = _options("estimate")
    for d in _settings(ESTIMATE):
        own = ESTIMATE_OWN.get(d.name, {})
        assert options[d.name].help == own.get("help", d.spec.help), d.name
    assert {"lora_r", "lora_target_modules", "max_length", "precision", "model"} <= set(options)
    # the job as `tuner search` reads it: the baseline files and every job flag, their defaults the search's
    job = {"baseline", "training_args", "max_target_length", "eval_batch_size", "generate", "generation_max_length"}
    assert job | {"num_beams"} <= set(options)
    assert options["max_length"].default is None and options["precision"].default is None


def test_tune_takes_the_declared_settings_as_keywords_and_documents_them() -> None:
    signature = inspect.signature(tuner.tune)
    declared_names = [d.name for d in _settings(TUNE)]
    assert list(signature.parameters) == [*declared_names, *RUN_KEYWORDS]
    assert signature.parameters["budget"].default is inspect.Parameter.empty  # required, as on the command line
    for d in _settings(TUNE):
        assert f"``{d.name}``" in (tuner.tune.__doc__ or "") and d.spec.help in (tuner.tune.__doc__ or "")


def test_the_api_body_is_the_declared_settings_a_study_holds() -> None:
    fields = StudyCreate.model_fields
    api = _settings(API)
    assert list(fields) == ["name", "budget_s", *(d.name for d in api)]
    for d in api:
        assert fields[d.name].description == (d.spec.api_help or d.spec.help), d.name
    # what stays on the worker host is not in the body: files, LoRA (its check builds the model), run settings
    assert not {"lora_r", "storage", "study", "lengths", "seed", "n_trials", "budget"} & set(fields)


def test_each_option_is_shown_in_its_declared_help_group_in_the_groups_order() -> None:
    from tuner.declared import PANELS

    for command, face in (("search", SEARCH), ("estimate", ESTIMATE)):
        options = _options(command)
        for d in _settings(face):
            assert options[d.name].rich_help_panel == d.spec.panel in PANELS, (command, d.name)
        shown = list(dict.fromkeys(o.rich_help_panel for o in options.values() if o.rich_help_panel in PANELS))
        assert shown == sorted(shown, key=PANELS.index), command  # job, data, search, storage, output


def test_tuner_explain_takes_the_job_and_its_data_but_nothing_only_a_search_uses() -> None:
    from tuner.declared import EXPLAIN

    options = _options("explain")
    assert {d.name for d in _settings(EXPLAIN)} <= set(options)
    job = {"model", "baseline", "training_args", "world_size", "device_memory", "global_batch", "max_length"}
    assert job | {"dataset", "input_column", "lora_r", "storage", "study", "transformers_version"} <= set(options)
    search_only = {"budget", "space", "headroom", "n_trials", "finalists", "seed", "estimate", "lengths"}
    assert not search_only & set(options)
    assert set(options) - {d.name for d in _settings(EXPLAIN)} == {"oom_text", "trial", "as_json_out"}
