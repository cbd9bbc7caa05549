"""Their training args through the ledger (tuner.job.ledger.held): every key run, kept or refused in one line; their
evaluation as their Trainer decides it (tuner.job.evaluation); the job line naming what their args make the probe
run (tuner.job.trainer_line)."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.errors import BaselineError
from tuner.interop.baseline import parse_baseline
from tuner.job.definition import resolve_job
from tuner.job.evaluation import evaluates, held_eval_batches, pile_line
from tuner.job.ledger.held import PROBE_SET, read_training_args
from tuner.job.trainer_line import trainer_parts

ARGS = {"output_dir": "out", "per_device_train_batch_size": 4, "max_seq_length": 128, "report_to": "wandb"}


def test_run_fields_reach_the_probe_and_neutral_ones_are_kept_and_named() -> None:
    held = read_training_args({**ARGS, "optim": "adafactor", "logging_steps": 5}, "5.25.0")
    assert held.trainer == {"optim": "adafactor", "logging_steps": 5}  # their fields, but what the probe sets
    assert not PROBE_SET & set(held.trainer)
    assert set(held.neutral) == {"output_dir", "report_to", "logging_steps"} and "optim" in held.run
    assert held.script == ("max_seq_length",)  # their script's length, read by tuner, not a TrainingArguments field
    assert held.lines() == [
        "kept, not probed (they change neither memory nor speed): logging_steps, output_dir, report_to"
    ]


@pytest.mark.parametrize(
    ("extra", "version", "said"),
    [
        ({"overwrite_output_dir": True}, "5.25.0", "(it is one of 4.57.3's); your Trainer raises on it"),
        ({"evaluation_strategy": "steps"}, "5.25.0", "(did you mean 'eval_strategy'?)"),
        ({"tp_size": 2}, "4.57.3", "nor a script argument tuner knows"),
        ({"activation_checkpointing": True}, "5.17.0", "(it is one of 5.25.0's)"),
        ({"use_cpu": True}, None, "trains on the CPU"),
        ({"parallelism_config": {"tp_size": 2}}, None, "tensor / context / hybrid parallelism is not probed"),
        ({"debug": "underflow_overflow"}, None, "debug hooks"),
        ({"accelerator_config": {"split_batches": True}}, None, "split_batches divides each batch"),
        ({"train_sampling_strategy": "batch_rebalance"}, None, "not probed yet"),
        ({"generation_config": "google/flan-t5-large"}, None, "write the generation config inline"),
        ({"per_gpu_train_batch_size": 4}, "4.57.3", "rename it per_device_train_batch_size"),
    ],
)
def test_a_refused_key_or_value_is_one_line_naming_it(extra: dict[str, Any], version: str | None, said: str) -> None:
    with pytest.raises(BaselineError, match="training args") as err:
        read_training_args({**ARGS, **extra}, version)
    message = str(err.value)
    assert said in message and "\n" not in message and next(iter(extra)) in message


def test_the_doctor_reads_on_past_refusals() -> None:
    held = read_training_args({**ARGS, "use_cpu": True, "optim": "sgd"}, "5.25.0", strict=False)
    assert set(held.refused) == {"use_cpu"} and held.trainer["optim"] == "sgd" and "use_cpu" not in held.trainer


def test_a_release_tuner_does_not_list_is_read_with_the_nearest_below() -> None:
    held = read_training_args(ARGS, "5.20.1")
    assert held.release.release == "5.17.0" and "5.20.1" in held.release.named
    assert read_training_args(ARGS, "4.30.0").release.release == "4.57.3"


@pytest.mark.parametrize(
    ("given", "evaluating"),
    [
        ({}, False),  # TrainingArguments' eval_strategy default "no": no eval step invented
        ({"eval_strategy": "no"}, False),
        ({"eval_strategy": "no", "do_eval": False}, False),
        ({"eval_strategy": "steps", "eval_steps": 100}, True),
        ({"eval_strategy": "epoch"}, True),
        ({"do_eval": True}, True),  # their script's evaluate() after training
        ({"do_predict": True}, True),
    ],
)
def test_evaluation_runs_exactly_when_theirs_does(given: dict[str, Any], evaluating: bool) -> None:
    assert evaluates(given) is evaluating
    base = parse_baseline(None, {**ARGS, "per_device_eval_batch_size": 6, **given})
    job = resolve_job(builtin=False, baseline_knobs=base.knobs, hf_args=base.hf_args)
    assert job.evaluates is evaluating and base.knobs["eval_batch_size"] == (6 if evaluating else None)
    assert ("no eval step" in job.describe()) is not evaluating


def test_what_evaluation_keeps_on_the_device() -> None:
    steps = {"eval_strategy": "steps"}
    assert held_eval_batches({**steps, "eval_accumulation_steps": 3}) == 3
    assert held_eval_batches({**steps, "eval_accumulation_steps": 3, "prediction_loss_only": True}) == 0
    assert held_eval_batches({**steps, "predict_with_generate": True}) == 0  # token ids, not logits
    assert held_eval_batches(steps) == 1 and "set eval_accumulation_steps to bound the pile" in str(pile_line(steps))
    assert held_eval_batches({"eval_accumulation_steps": 3}) == 0  # never evaluates


def test_generation_config_inline_gives_the_generate_settings() -> None:
    given = {**ARGS, "eval_strategy": "epoch", "predict_with_generate": True}
    given["generation_config"] = {"max_new_tokens": 40, "num_beams": 3}
    base = parse_baseline(None, given)
    job = resolve_job(builtin=False, baseline_knobs=base.knobs, hf_args=base.hf_args)
    assert (job.generation_max_length, job.num_beams) == (40, 3)


@pytest.mark.parametrize(
    ("extra", "part"),
    [
        ({"optim": "adafactor"}, "optimizer adafactor (args: optim)"),
        ({"label_smoothing_factor": 0.1}, "label smoothing 0.1"),
        ({"torch_compile": True}, "torch.compile (inductor"),
        ({"torch_compile_mode": "max-autotune"}, "torch.compile (inductor, max-autotune"),
        ({"train_sampling_strategy": "group_by_length"}, "length-grouped batches"),
        ({"group_by_length": True}, "length-grouped batches"),
        ({"neftune_noise_alpha": 5}, "NEFTune alpha 5"),
        ({"gradient_checkpointing_kwargs": {"use_reentrant": True}}, "checkpointing {'use_reentrant': True}"),
        ({"torch_empty_cache_steps": 4}, "emptied every 4 steps"),
        ({"eval_accumulation_steps": 2}, "eval logits of 2 batches"),
        ({"tf32": True}, "TF32 matmuls"),
        ({"full_determinism": True}, "deterministic algorithms"),
    ],
)
def test_the_job_line_names_what_their_args_make_the_probe_run(extra: dict[str, Any], part: str) -> None:
    assert trainer_parts({}) == []
    assert any(part in p for p in trainer_parts(extra)), trainer_parts(extra)
