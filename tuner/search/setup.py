"""What one search works on (``SearchSetup``: the space, the fixed job parameters, the memory limits, the schedule),
what the strategy hands the driver (``Proposal``: one probe to run) and what it makes of the result (``Outcome``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from trials.contract import FsdpSettings, JobSettings, Knobs, ModelSpec, ProbeConfig, ProbeResult
from tuner.job.batching import accumulation_steps
from tuner.job.objective import Objective
from tuner.job.space import Space
from tuner.probing.batches import data_batches
from tuner.probing.config import probe_config
from tuner.records import DEFAULT_HEADROOM, Fidelity, ProbeRow
from tuner.search.observation import probe_row
from tuner.search.schedule import Schedule

if TYPE_CHECKING:
    from tuner.job.data_job import DataJob
    from tuner.search.request import SearchRequest


@dataclass(frozen=True)
class SearchSetup:
    """What one search works on: the space, the fixed job parameters, the memory limits and the probe schedule."""

    space: Space
    model: ModelSpec
    world_size: int
    global_batch: int
    objective: Objective
    device_memory: int | None = None
    headroom: float = DEFAULT_HEADROOM
    schedule: Schedule = field(default_factory=Schedule)
    baseline: Knobs | None = None
    n_trials: int | None = None  # explore probes the search may run (inferred configs and duplicates are free)
    seed: int | None = None
    job: JobSettings = field(default_factory=JobSettings)  # label/generation lengths and beams of the user's job
    deepspeed_base: Mapping[str, Any] | None = None  # the user's DeepSpeed JSON, "auto" resolved: every probe's base
    # trial 0's: deepspeed_base as the user's Trainer fills it, without the fixes the exports write (None: the same)
    deepspeed_given: Mapping[str, Any] | None = None
    training_args: Mapping[str, Any] | None = None  # the user's training args (the Trainer's optimizer values)
    data: DataJob | None = None  # the user's data: every probe's memory at its worst batch, timed on drawn ones
    fsdp: FsdpSettings | None = None  # the user's FSDP2 settings every fsdp2 probe holds (None: accelerate's)
    nnodes: int = 1  # the nodes each probe spans (world_size / nnodes ranks on each)

    @classmethod
    def of(cls, request: SearchRequest) -> SearchSetup:
        return cls(
            space=request.space,
            model=request.model,
            world_size=request.world_size,
            global_batch=request.global_batch,
            objective=request.objective,
            device_memory=request.device_memory,
            headroom=request.headroom,
            schedule=request.schedule,
            baseline=request.baseline,
            n_trials=request.n_trials,
            seed=request.seed,
            job=request.job.settings() if request.job is not None else JobSettings(),
            deepspeed_base=request.baseline_source,
            deepspeed_given=as_their_trainer_runs(request.baseline_source, request.trainer),
            training_args=(request.baseline_files or {}).get("training_args"),
            data=request.data,
            fsdp=FsdpSettings.model_validate(request.fsdp) if request.fsdp is not None else None,
            nnodes=request.nnodes,
        )

    def probe_config(self, knobs: Knobs, fidelity: Fidelity, timeout_s: float) -> ProbeConfig:
        """The probe of ``knobs`` at ``fidelity`` (its warm-up and measured steps) with the user's job around it."""
        accum = accumulation_steps(self.global_batch, knobs.micro_batch_size, self.world_size)
        if accum is None:  # the space is restricted to reachable micro batches; a baseline may not be
            raise ValueError(f"micro batch {knobs.micro_batch_size} cannot reach global batch {self.global_batch}")
        warmup, measure = self.schedule.confirm if fidelity == Fidelity.CONFIRM else self.schedule.short
        batches = None
        if self.data is not None:
            batches = data_batches(
                self.data,
                knobs,
                self.job,
                world_size=self.world_size,
                measure_steps=measure,
                gradient_accumulation_steps=accum,
                seed=self.seed or 0,
            )
        given = fidelity == Fidelity.BASELINE and self.deepspeed_given is not None
        return probe_config(
            knobs=knobs,
            baseline=self.deepspeed_given if given else self.deepspeed_base,
            training_args=self.training_args,
            model=self.model,
            world_size=self.world_size,
            nnodes=self.nnodes,
            gradient_accumulation_steps=accum,
            warmup_steps=warmup,
            measure_steps=measure,
            device_memory=self.device_memory,
            timeout_s=timeout_s,
            seed=self.seed or 0,
            job=self.job,
            batches=batches,
            fsdp=self.fsdp,
        )

    def row_for(self, proposal: Proposal, result: ProbeResult) -> ProbeRow:
        """The row of a finished probe of ``proposal`` (without run_id/study_name: the driver stores it)."""
        return probe_row(
            proposal.config,
            result,
            trial_number=proposal.trial_number,
            fidelity=proposal.fidelity,
            config_key=proposal.config_key,
            estimate_bytes=proposal.estimate_bytes,
            objective=self.objective,
            device_memory=self.device_memory,
            headroom=self.headroom,
        )


def as_their_trainer_runs(
    source: Mapping[str, Any] | None, trainer: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """The probes' DeepSpeed base ``source`` as the user's own Trainer runs it: the fixes the exports write
    (``trainer``: the study definition's part, tuner.interop.trainer_fill) taken back. Trial 0 runs this, so a config
    their Trainer refuses is refused (tuner.probing.schedule_check); None when there is nothing to take back."""
    if source is None or not trainer or not trainer.get("fixes"):
        return None
    from tuner.interop.trainer_fill import TrainerFix, apply_fixes

    fixes = [TrainerFix.from_dict(f) for f in trainer["fixes"]]
    return apply_fixes(source, fixes, "deepspeed", undo=True)


@dataclass
class Proposal:
    config: ProbeConfig
    fidelity: Fidelity
    config_key: str
    trial: optuna.trial.Trial | None
    expected_s: float
    estimate_bytes: int | None = None

    @property
    def trial_number(self) -> int | None:
        return self.trial.number if self.trial is not None else None


@dataclass
class Outcome:
    row: ProbeRow  # without run_id/study_name: the driver stores it
    state: TrialState | None  # what the Optuna trial was told (None for confirm probes)
    objective: float | None
    stable: bool


__all__ = ["Outcome", "Proposal", "SearchSetup"]
