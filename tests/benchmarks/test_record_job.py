"""The recorder's job (benchmarks.record_job): a table row runs the job `tuner search --baseline FILE` builds from the
same file. A TRL recipe's DPO pairs and reference, its packing, its use_peft adapters and, with TRL >= 1.16 importable,
TRL's fused LM head reach the probe's JobSettings and the trace; a plain training-args file gives what it gave before
(its held trainer args, the eval batches it holds)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from benchmarks.record_job import job_trainer, recorded_job
from tests.tuner.job.test_ledger_trl import trl_folder
from trials.contract import JobSettings, ModelSpec
from tuner.interop.baseline import Baseline
from tuner.interop.baseline_files import load_baseline
from tuner.job.definition import JobFlags
from tuner.job.evaluation import held_eval_batches
from tuner.job.ledger.held import read_training_args
from tuner.job.space import space_from_dict
from tuner.search.request import build_request

INPUTS = Path(__file__).resolve().parents[2] / "benchmarks" / "inputs"
LLAMA = ModelSpec(source="builtin:tiny-llama")


def job(name: str) -> JobSettings:
    return recorded_job(LLAMA, [64], INPUTS / name)


def test_sft_recipes_carry_packing_and_their_adapters() -> None:
    plain, packed, lora, both = (job(f"trl-sft{s}.yaml") for s in ("", "-packed", "-lora", "-packed-lora"))
    assert plain.padding_free is None and plain.lora is None and plain.dpo is None
    assert packed.padding_free == both.padding_free == "bfd"  # TRL 1.16's default strategy, trained padding-free
    assert lora.lora is not None and lora.lora.r == 8 and lora.lora.alpha == 16 and lora.padding_free is None
    assert both.lora == lora.lora
    assert plain.trainer_args == {"learning_rate": 2e-05, "logging_steps": 10}  # SFTConfig's own defaults, held


def test_dpo_recipes_carry_their_reference() -> None:
    model, precomputed, peft = (job(f"trl-dpo{s}.yaml") for s in ("", "-precomputed", "-peft"))
    assert model.dpo is not None and model.dpo.reference == "model" and model.dpo.beta == 0.1
    assert precomputed.dpo is not None and precomputed.dpo.reference == "precomputed"
    assert peft.dpo is not None and peft.dpo.reference == "adapter" and peft.lora is not None  # adapter off: reference
    trainer = job_trainer(peft)
    assert trainer is not None and trainer.dpo == peft.dpo  # the trace runs the pairs and the reference too


def test_trl_on_the_path_gives_its_fused_head(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(trl_folder()))
    for name, outputs in (("trl-sft-packed.yaml", 3), ("trl-dpo.yaml", 4)):
        settings = job(name)
        assert settings.trl_head is not None and settings.trl_head.version == "1.16.0", name
        assert len(settings.trl_head.outputs) == outputs
        trainer = job_trainer(settings)
        assert trainer is not None and trainer.trl_head == settings.trl_head
        assert trainer.padding_free == settings.padding_free


def _baseline(path: Path, world: int | None, longest: int) -> Baseline:
    return load_baseline(path, world_size=world, max_length=longest)


def test_the_job_is_the_one_tuner_search_builds() -> None:
    for name in ("trl-sft-packed-lora.yaml", "trl-dpo-peft.yaml", "adafactor-no-eval.json"):
        space = space_from_dict({"micro_batch_size": [2, 4], "max_length": [64]}, "test")
        request = build_request(
            study_name="t",
            storage="sqlite://",
            model=LLAMA,
            space=space,
            budget_s=60,
            baseline=functools.partial(_baseline, INPUTS / name),
            job_flags=JobFlags(max_length=64),
        )
        assert request.job is not None
        assert job(name) == request.job.settings(), name


def test_a_plain_training_args_file_gives_what_it_gave_before() -> None:
    path = INPUTS / "adafactor-no-eval.json"
    given = json.loads(path.read_text())
    settings = recorded_job(LLAMA, [128], path, lora_r=8, lora_alpha=16)
    assert settings.trainer_args == read_training_args(given).trainer
    assert settings.eval_held_batches == held_eval_batches(given)
    assert settings.lora is not None and settings.lora.r == 8 and settings.dpo is None and settings.trl_head is None
    assert recorded_job(LLAMA, [128]).model_dump(exclude_defaults=True) == {}  # no file: the defaults
