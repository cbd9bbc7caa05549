"""What `tuner explain --study S --trial N` explains: a probed trial of a stored study. The trial's knobs, model,
world size and job come from its stored probe (the ProbeConfig it ran), the device memory from its result (else the
study's); the model is traced at the trial's shape (checkpointing off and on, for the changes) and at the shapes of
the study's other measured probes, on which the estimate is calibrated; the trial's measured per-phase peaks and its
ranks' recorded failures (tuner.records.measurement) are set against the estimate by tuner.memory.explain, with
each failure's CUDA memory snapshot read and attributed to the estimate's parts (tuner.memory.snapshot_parts; a file
that is gone or unreadable is one line in the explanation, never an error).

Bad input is one line (a TunerError, exit 2): an unknown study, a trial number the study lacks, a trial that
measured nothing (ruled out without running, or failed before its memory window)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trials.contract import DataBatches, FsdpSettings, JobSettings, Knobs, ModelSpec
from tuner.errors import ConfigError, TunerError
from tuner.memory.estimator import Estimator, Evaluation, accumulates, fsdp_at, trace, trace_at
from tuner.memory.explain import Inputs, MeasuredTrial
from tuner.memory.snapshot_child import read_all as read_snapshots
from tuner.memory.trace import FsdpAt, trace_trainer
from tuner.records.probe import ProbeRow
from tuner.session.best import pick_study
from tuner.session.explain_job import TRACE_TIMEOUT_S
from tuner.storage.store import Store

MAX_CALIBRATION_PROBES = 8  # the study's latest measured ok probes the estimate is calibrated on (each is traced)


@dataclass(frozen=True)
class TrialInputs:
    """What the trial's explanation is computed from, and the `tuner search` that probes a change of it."""

    inputs: Inputs
    measured: MeasuredTrial
    search: str
    model: str


def _trial_row(store: Store, study: str, trial: int) -> ProbeRow:
    rows = [r for r in store.probes(study) if r.trial_number is not None]
    found = [r for r in rows if r.trial_number == trial]
    if not found:
        have = sorted({r.trial_number for r in rows if r.trial_number is not None})
        listed = f"its trials are {have[0]}-{have[-1]}" if have else "it has no trials yet"
        raise ConfigError(f"--trial {trial}: study {study!r} has no trial {trial} ({listed}; see `tuner trials`)")
    measured = [r for r in found if r.measured and r.measurement.ranks]
    if not measured:
        row = found[0]
        raise ConfigError(
            f"--trial {trial} of study {study!r} has no measurement to explain ({row.status}: "
            f"{row.cause or 'nothing measured'}); pick a trial that ran (see `tuner trials`)"
        )
    return measured[0]


def _calibration(rows: list[ProbeRow], trial: ProbeRow) -> list[tuple[Knobs, int]]:
    """The study's other measured ok probes of the same model and world size, with what each needed (the latest
    MAX_CALIBRATION_PROBES)."""
    out = []
    for r in rows:
        if r is trial or r.id == trial.id or not r.measured or r.status != "ok" or not r.memory_need:
            continue
        if r.config.get("model") != trial.config.get("model") or r.config.get("world_size") != trial.config.get(
            "world_size"
        ):
            continue
        out.append((Knobs.model_validate(r.knobs), int(r.memory_need)))
    return out[-MAX_CALIBRATION_PROBES:]


def _evaluation(knobs: Knobs, job: JobSettings) -> Evaluation | None:
    """The trial's evaluation as the probe ran it, traced at one sample a batch (the estimate scales per sample)."""
    if knobs.eval_batch_size is None and not knobs.generate:
        return None
    return Evaluation(
        eval_batch_size=1,
        generate=knobs.generate,
        generation_max_length=job.generation_length(knobs.max_length),
        num_beams=job.num_beams,
    )


def _fsdp_points(
    both: list[Knobs], calib: list[tuple[Knobs, int]], world: int, global_batch: int | None
) -> list[FsdpAt]:
    """An FSDP2 trial's own points (with and without checkpointing, at its length and half of it, for the changes the
    explain weighs) and its FSDP2 calibration probes' (tuner.memory.fsdp: FSDP2 is traced per config)."""
    out = set()
    for k in both:
        if k.engine == "fsdp2":
            acc = accumulates(global_batch, k.micro_batch_size, world)
            out |= {fsdp_at(k, world, acc, length=n) for n in {k.max_length, max(1, k.max_length // 2)}}
    out |= {
        fsdp_at(c, world, accumulates(global_batch, c.micro_batch_size, world)) for c, _ in calib if c.engine == "fsdp2"
    }
    return sorted(p for p in out if p[3] != "fp16")  # fp16 FSDP2 does not trace on CPU (its scaler needs CUDA)


def first_explainable(rows: Sequence[ProbeRow]) -> int | None:
    """The first trial of ``rows`` that measured a rank's memory (ok or OOM), or None: a trial refused before
    launching (their release's fill DeepSpeed refuses) or ruled out without running measured nothing to explain."""
    for r in rows:
        if r.measured and r.measurement.ranks and r.trial_number is not None:
            return int(r.trial_number)
    return None


def trial_inputs(store: Store, study: str | None, trial: int | None) -> TrialInputs:
    """The inputs of the trial's explanation (``trial`` None: the study's first trial that measured something, the
    baseline when it ran; one refused before launching measured nothing)."""
    name, definition = pick_study(store, study)
    rows = store.probes(name)
    if trial is None:
        trial = first_explainable(rows)
        if trial is None:
            raise ConfigError(f"study {name!r} has no probed trial to explain yet")
    row = _trial_row(store, name, trial)
    knobs = Knobs.model_validate(row.knobs)
    model = ModelSpec.model_validate(row.config.get("model") or {})
    job = JobSettings.model_validate(row.config.get("job") or {})
    world = int(row.config.get("world_size") or definition.world_size or 1)
    m = row.measurement
    capacity = row.capacity or definition.device_memory or max((r.capacity or 0 for r in m.ranks), default=0)
    if not capacity:
        raise ConfigError(f"trial {trial} of study {name!r} stored no device memory to explain against")
    calib = _calibration(rows, row)
    both = [knobs.model_copy(update={"gradient_checkpointing": ckpt}) for ckpt in (False, True)]
    shapes = {trace_at(k) for k in [*both, *(c for c, _ in calib)] if k.engine != "fsdp2"}
    tr = trace(
        model,
        sorted(shapes),
        timeout_s=TRACE_TIMEOUT_S,
        label_length=job.max_target_length,
        lora=job.lora,
        evaluation=_evaluation(knobs, job),
        padded=_padded(row.config),
        fsdp_points=_fsdp_points(both, calib, world, definition.global_batch),
        fsdp=FsdpSettings.model_validate(definition.fsdp) if definition.fsdp else None,
        trainer=trace_trainer(
            job.trainer_args,
            job.seq2seq_args,
            job.eval_held_batches,
            row.config.get("deepspeed"),
            dpo=job.dpo,
            padding_free=job.padding_free,
            trl_head=job.trl_head,
        ),
    )
    estimator = Estimator(trace=tr, world_size=world, global_batch=definition.global_batch)
    for k, need in calib:
        try:
            estimator.observe(k, need)
        except TunerError:  # a calibration probe the trace has no point for: not calibrated on
            continue
    failures = tuple((r.rank, r.failed_allocation, r.snapshot) for r in m.ranks if r.failed_allocation is not None)
    measured = MeasuredTrial(
        study=name,
        trial=trial,
        status=str(row.status),
        cause=row.cause,
        phases=m.phase_peaks,
        need=m.memory_need if row.status == "ok" else None,
        oom_need=m.oom_need or None,
        failures=failures,
        snapshots=tuple(r.snapshot for r in m.ranks if r.snapshot),
        snapshot_reads=read_snapshots(list(dict.fromkeys(s for _, _, s in failures if s))),  # one budget
    )
    inputs = Inputs(
        estimator=estimator,
        config=knobs,
        capacity=capacity,
        world_size=world,
        global_batch=definition.global_batch,
        traced_lengths=(knobs.max_length,),
    )
    search = _search(model, knobs, job, world, capacity, definition.global_batch)
    return TrialInputs(inputs, measured, search, model.source)


def _search(model: ModelSpec, k: Knobs, job: JobSettings, world: int, capacity: int, global_batch: int | None) -> str:
    """The `tuner search` of the trial's job (its model, world, batch, memory and lengths) that probes a change."""
    out = [
        "tuner",
        "search",
        "--model",
        model.source,
        "--device-memory",
        str(capacity),
        "--max-length",
        str(k.max_length),
    ]
    if job.max_target_length:
        out += ["--max-target-length", str(job.max_target_length)]
    if world > 1:
        out += ["--world-size", str(world)]
    if global_batch:
        out += ["--global-batch", str(global_batch)]
    return shlex.join(out)


def _padded(config: dict[str, Any]) -> bool:
    """Whether the stored probe's worst batch carried the collator's padding (a probe of a job with data)."""
    batches = config.get("batches")
    if not batches:
        return False
    return DataBatches.model_validate(batches).worst.padded
