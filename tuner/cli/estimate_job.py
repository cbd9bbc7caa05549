"""What `tuner estimate` estimates: the job and the config from the same settings `tuner search` reads (the model,
--baseline / --training-args, world size, global batch, the job flags), the config's knobs from the baseline unless
an option names them. Pure but for reading the user's files."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trials.contract import BUILTIN_PREFIX, FsdpSettings, Knobs, ModelSpec
from tuner.errors import BaselineError, ConfigError
from tuner.job.batching import held_global_batch, validated_knobs
from tuner.job.definition import BUILTIN_DEFAULTS, Job, JobFlags, resolve_job
from tuner.job.ledger.trl import check_model, packing_of, recipe_args
from tuner.memory.trace import Evaluation, TraceTrainer, trace_trainer
from tuner.session.options import cli_option

if TYPE_CHECKING:
    from tuner.job.data_job import DataJob

#: the knobs `tuner estimate` takes as options, and their value without a baseline
KNOB_DEFAULTS: Mapping[str, Any] = {
    "micro_batch_size": None,
    "engine": "deepspeed",
    "zero_stage": 0,
    "offload_optimizer": False,
    "gradient_checkpointing": False,
    "overlap_comm": False,
    "contiguous_gradients": True,
    "reduce_bucket_size": None,
    "allgather_bucket_size": None,
    "reshard_after_forward": None,  # FSDP2's (the Knobs default: on)
    "offload_params": None,
    "offload_param": None,  # ZeRO-3's (the Knobs default: off)
}
#: the knobs only DeepSpeed has: dropped from the baseline's when an option picks engine fsdp2 (and FSDP2's when it
#: picks another), so `--engine fsdp2` on a ZeRO baseline estimates FSDP2 for the same job
DEEPSPEED_ONLY = (
    "zero_stage",
    "offload_optimizer",
    "offload_param",
    "overlap_comm",
    "allgather_bucket_size",
    "reduce_bucket_size",
)
FSDP_ONLY = ("reshard_after_forward", "offload_params")


@dataclass(frozen=True)
class EstimateJob:
    """One config of one job on ``world_size`` ranks; ``global_batch`` None: accumulation assumed."""

    model: ModelSpec
    job: Job
    knobs: Knobs
    world_size: int
    global_batch: int | None
    source: str  # where the knobs came from, for the header
    data: DataJob | None = None  # the user's data (--dataset): the job's lengths are its longest sample's
    fsdp: FsdpSettings | None = None  # an FSDP2 baseline's own settings (wrap policy ...), as its probes hold them
    length_sources: Mapping[str, str] = field(default_factory=dict)  # where each length came from (with data)
    deepspeed: Mapping[str, Any] | None = None  # the baseline's DeepSpeed JSON (an optimizer section runs, not optim)

    @property
    def trainer(self) -> TraceTrainer | None:
        """The job's training args as the probes run them, for the trace."""
        held = self.job.eval_held_batches if self.job.evaluates else 0
        job = self.job
        return trace_trainer(
            job.trainer_args,
            job.seq2seq_args,
            held,
            self.deepspeed,
            bool(job.compile),
            job.dpo,
            padding_free=job.padding_free,
            trl_head=job.trl_head,
        )

    def data_lines(self) -> list[str]:
        """The data's lengths and where the job's came from, as the dry run says them (none without --dataset)."""
        if self.data is None:
            return []
        return self.data.lines(self.job.max_length, self.job.max_target_length, self.length_sources)

    @property
    def evaluation(self) -> Evaluation | None:
        """What the eval phases trace (None: the job does not evaluate)."""
        if not self.job.evaluates:
            return None
        return Evaluation(
            eval_batch_size=self.job.eval_batch_size or self.knobs.micro_batch_size,
            generate=self.job.generate,
            generation_max_length=self.job.generation_max_length or self.job.max_target_length,
            num_beams=self.job.num_beams,
        )


def _knob_values(theirs: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    """Their baseline's knobs with the knob options over them (an engine option drops the other engine's knobs),
    then :data:`KNOB_DEFAULTS` for what neither gives."""
    values = {k: v for k, v in theirs.items() if k in Knobs.model_fields}
    if knobs.get("engine") is not None and knobs["engine"] != values.get("engine", knobs["engine"]):
        other = DEEPSPEED_ONLY if knobs["engine"] == "fsdp2" else FSDP_ONLY
        values = {k: v for k, v in values.items() if k not in other}
    fsdp2 = (knobs.get("engine") or values.get("engine")) == "fsdp2"
    for name, default in KNOB_DEFAULTS.items():
        if knobs.get(name) is not None:
            values[name] = knobs[name]
        elif name not in values and default is not None and not (fsdp2 and name in DEEPSPEED_ONLY):
            values[name] = default
    if values.get("zero_stage") != 3 and knobs.get("offload_param") is None:
        values.pop("offload_param", None)  # a ZeRO-3 baseline's parameter offload, at the stage an option picked
    return values


def estimate_job(
    model: ModelSpec, settings: Mapping[str, Any], knobs: Mapping[str, Any], data: DataJob | None = None
) -> EstimateJob:
    """The job and config from the declared settings (``settings``: `tuner estimate`'s face of SearchOptions and
    JobFlags) and the knob options (``knobs``: None = not given: the baseline's, else :data:`KNOB_DEFAULTS`). With
    ``data``, a length neither a flag nor the training args give is the data's longest sample (as `tuner search`)."""
    flags = JobFlags(**{k: settings.get(k) for k in JobFlags.__dataclass_fields__})
    builtin = model.source.startswith(BUILTIN_PREFIX)
    base = None
    if settings.get("baseline") is not None:
        from tuner.interop.baseline_files import load_baseline

        longest = data.defaults().max_length if data is not None else None
        guess = flags.max_length or longest or int(BUILTIN_DEFAULTS["max_length"])
        training = settings.get("training_args")
        base = load_baseline(
            Path(settings["baseline"]),
            Path(training) if training is not None else None,
            world_size=settings.get("world_size"),
            max_length=guess,
            transformers_version=settings.get("transformers_version"),
        )
    elif settings.get("training_args") is not None:
        raise BaselineError("--training-args goes with --baseline (your DeepSpeed JSON); pass both")
    check_model(base.hf_args if base is not None else None, model.source)  # a TRL recipe's model is the one probed
    hf_args = recipe_args(base.hf_args) if base is not None else None  # an SFT recipe: TRL's default max_length
    sources: dict[str, str] = {}
    if data is not None:  # their data's longest sample, unless their args or a flag set a length (then: truncation)
        from tuner.job.data_job import fill_from_data, length_sources

        sources = length_sources(flags, hf_args, True, builtin)
        flags = fill_from_data(flags, data, hf_args)
    job = resolve_job(
        builtin=builtin,
        baseline_knobs=base.knobs if base is not None else None,
        hf_args=hf_args,
        flags=flags,
        option=cli_option,
        trainer=(base.trainer_args, base.seq2seq_args) if base is not None else None,
        compile=base.compile if base is not None else None,
    )
    if data is not None:  # an SFT recipe's packing: the rows SFTTrainer trains on (tuner.job.packing)
        from tuner.job.packed_data import packed_data

        data = packed_data(data, hf_args, job.max_length)
    world = settings.get("world_size") or (base.world_size if base is not None else None) or 1
    batch = settings.get("global_batch") or (base.global_batch if base is not None else None)
    files, how = None, ""
    if base is not None:  # theirs: a different --global-batch only as a change asked for (tuner.job.batching)
        micro, accum = int(base.knobs["micro_batch_size"]), base.gradient_accumulation_steps
        files, how = base.global_batch or micro * accum * world, f"micro {micro} x accumulation {accum} x world {world}"
    held_global_batch(settings.get("global_batch"), files, how, bool(settings.get("change_global_batch")), cli_option)
    values = _knob_values(base.knobs if base is not None else {}, knobs)
    if values.get("micro_batch_size") is None:
        raise ConfigError("no micro batch: pass --micro-batch-size, or --baseline with your DeepSpeed / HF config")
    values.update(
        precision=job.precision, max_length=job.max_length, eval_batch_size=job.eval_batch_size, generate=job.generate
    )
    config = validated_knobs(values, batch, world)
    source = "your baseline" + (" with options" if any(v is not None for v in knobs.values()) else "")
    source = source if base is not None else "options"
    if packing_of(hf_args or {}) == "wrapped":  # an SFT recipe's packing: said where the estimate says its config
        source += " (your recipe's packing wrapped: every row max_length tokens, the worst batch is every batch)"
    held = FsdpSettings.model_validate(base.fsdp) if base is not None and base.fsdp else None
    deepspeed = base.ds_config if base is not None else None
    return EstimateJob(
        model, job, config, world, batch, source, data, length_sources=sources, fsdp=held, deepspeed=deepspeed
    )
