"""The job a recorded table's probes and traces run (benchmarks/record.py), built as `tuner search` builds its own.

A ``--training-args`` file (training-args JSON, or a TRL recipe's YAML / JSON) is read through tuner's baseline
reader (tuner.interop.baseline_files.load_baseline) and resolved by tuner.job.definition.resolve_job, the path
`tuner search --baseline FILE` and `tuner estimate` take: so a table row runs the recipe's job, a DPO recipe's pairs
and reference (JobSettings.dpo), an SFT recipe's padding-free packing (padding_free), its use_peft adapters (lora),
and TRL's fused LM head where TRL >= 1.16 is importable (trl_head), and its trace the same. The --lora-* flags go
over a recipe's use_peft + lora_*, as on the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trials.contract import BUILTIN_PREFIX, JobSettings, ModelSpec
from tuner.job.definition import JobFlags, resolve_job
from tuner.memory.trace import TraceTrainer, trace_trainer


def recorded_job(
    model: ModelSpec,
    lengths: Sequence[int],
    training_args: Path | None = None,
    *,
    lora_r: int | None = None,
    lora_alpha: int | None = None,
    lora_target_modules: str | None = None,
    max_target_length: int | None = None,
    generation_max_length: int | None = None,
) -> JobSettings:
    """The table's job: ``training_args`` read as `tuner search --baseline` reads them, with the flags over them;
    ``lengths``: the grid's max_length values (the longest is the job's length, as a space file listing lengths
    says). The eval batches held on the device are the training args' own (the grid's eval knobs decide whether
    a row evaluates)."""
    from tuner.job.evaluation import held_eval_batches
    from tuner.job.ledger.trl import check_model, recipe_args

    flags = JobFlags(
        max_length=max(lengths),
        max_target_length=max_target_length,
        generation_max_length=generation_max_length,
        lora_r=lora_r,
        lora_alpha=lora_alpha,
        lora_target_modules=lora_target_modules,
    )
    option = _flag
    if training_args is None:
        return resolve_job(builtin=model.source.startswith(BUILTIN_PREFIX), flags=flags, option=option).settings()
    from tuner.interop.baseline_files import load_baseline

    base = load_baseline(training_args, max_length=max(lengths))
    check_model(base.hf_args, model.source)
    args = recipe_args(base.hf_args)
    job = resolve_job(
        builtin=model.source.startswith(BUILTIN_PREFIX),
        baseline_knobs=base.knobs,
        hf_args=args,
        flags=flags,
        option=option,
        trainer=(base.trainer_args, base.seq2seq_args),
        compile=base.compile,
    )
    return job.settings().model_copy(update={"eval_held_batches": held_eval_batches(dict(base.hf_args or {}))})


def job_trainer(job: JobSettings) -> TraceTrainer | None:
    """The trace's view of the table's job (tuner.session.memory.job_trainer's, without a DeepSpeed JSON)."""
    return trace_trainer(
        job.trainer_args,
        job.seq2seq_args,
        job.eval_held_batches,
        None,
        bool(job.compile),
        job.dpo,
        padding_free=job.padding_free,
        trl_head=job.trl_head,
    )


def job_record(job: JobSettings) -> dict[str, Any]:
    """The job as the table stores it (its JobSettings, JSON)."""
    return job.model_dump(mode="json")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
