"""tuner.job.lora: a LoRA job is a job setting from the user's flags, stored, shown, compared on resume; its
mistakes are one line naming the fix."""

from __future__ import annotations

from typing import Any

import pytest

from trials.contract import LoraSpec, ModelSpec
from tuner.errors import ConfigError
from tuner.job.definition import Job, JobFlags, resolve_job
from tuner.job.lora import check_lora, lora_spec
from tuner.job.space import default_space
from tuner.search.request import build_request, check_resume
from tuner.session.options import cli_option


def test_the_flags_give_the_spec_and_none_without_a_rank() -> None:
    spec = lora_spec(16, 32, 0.05, "q_proj, v_proj,", None)
    assert spec == LoraSpec(r=16, alpha=32, dropout=0.05, target_modules=("q_proj", "v_proj"))
    assert lora_spec(4, target_modules=["q", "v"]) == LoraSpec(r=4, target_modules=("q", "v"))
    assert lora_spec(4) == LoraSpec(r=4, alpha=8, dropout=0.0, target_modules=(), bias="none")  # peft's defaults
    assert lora_spec(None) is None


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"r": 0}, "--lora-r 0 must be at least 1"),
        ({"r": None, "alpha": 16}, "--lora-alpha needs --lora-r"),
        ({"r": None, "target_modules": "q_proj"}, "--lora-target-modules needs --lora-r"),
        ({"r": 8, "alpha": 0}, "--lora-alpha 0 must be at least 1"),
        ({"r": 8, "dropout": 1.0}, r"--lora-dropout 1 must be in \[0, 1\)"),
        ({"r": 8, "bias": "some"}, "--lora-bias 'some': choose one of none, all, lora_only"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it(args: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        lora_spec(**args, option=cli_option)
    assert "\n" not in str(err.value)


def test_without_peft_the_line_says_how_to_install_it() -> None:
    with pytest.raises(ConfigError, match=r"--lora-r: LoRA jobs need peft, which is not installed; pip install peft"):
        lora_spec(8, option=cli_option, peft_installed=False)


def test_the_job_holds_the_spec_its_probes_get_it_and_it_is_shown() -> None:
    flags = JobFlags(lora_r=4, lora_alpha=16, lora_target_modules="q_proj,v_proj")
    job = resolve_job(builtin=True, flags=flags)
    assert job.lora == LoraSpec(r=4, alpha=16, target_modules=("q_proj", "v_proj"))
    assert job.settings().lora == job.lora  # what every probe's ProbeConfig carries
    assert job.describe() == (
        "fp32, length 128, no eval step, LoRA r 4 alpha 16 on q_proj,v_proj (adapters train, base frozen)"
    )
    assert Job.model_validate(job.model_dump(mode="json")) == job  # stored in the definition and read back
    assert resolve_job(builtin=True).lora is None  # no flag: a full fine-tune


def _definition(flags: JobFlags) -> dict[str, Any]:
    request = build_request(
        study_name="s",
        storage="sqlite://",
        model=ModelSpec(source="builtin:tiny-llama"),
        space=default_space(),
        budget_s=60,
        job_flags=flags,
        option=cli_option,
    )
    return request.definition()


def test_a_resume_with_another_lora_setting_is_refused_naming_the_job() -> None:
    stored = _definition(JobFlags(lora_r=4))
    assert stored["job"]["lora"]["r"] == 4
    check_resume("s", stored, _definition(JobFlags(lora_r=4)), {"job"})  # the same job: resumes
    with pytest.raises(ConfigError, match=r"study 's' was created with a different job"):
        check_resume("s", stored, _definition(JobFlags(lora_r=8)), {"job"})
    with pytest.raises(ConfigError, match=r"--lora-alpha needs --lora-r"):
        _definition(JobFlags(lora_alpha=8))


def test_a_target_module_the_model_lacks_is_one_line_before_any_probe() -> None:
    with pytest.raises(ConfigError) as err:
        check_lora(ModelSpec(source="builtin:tiny-llama"), LoraSpec(r=4, target_modules=("q",)), cli_option)
    line = str(err.value)
    assert "\n" not in line and line.startswith("LoRA target module q not in the model; its linear layers are ")
    assert "q_proj" in line and line.endswith("name them in --lora-target-modules")


def test_tune_takes_the_same_settings_as_keywords_named_as_it_spells_them() -> None:
    import tuner

    with pytest.raises(ConfigError, match=r"^lora_r 0 must be at least 1"):
        tuner.tune(budget=60, model="builtin:tiny-llama", storage="sqlite://", lora_r=0)
    with pytest.raises(ConfigError, match=r"^lora_target_modules needs lora_r"):
        tuner.tune(budget=60, model="builtin:tiny-llama", storage="sqlite://", lora_target_modules=["q_proj"])


def test_estimate_takes_the_lora_settings_too() -> None:
    import tuner

    with pytest.raises(ConfigError, match=r"^lora_dropout needs lora_r"):
        tuner.estimate("builtin:tiny-llama", {"micro_batch_size": 4, "max_length": 64}, lora_dropout=0.1)
