"""`tuner estimate`: the predicted peak device memory of one config per phase and part, without probing (no GPU
needed); ``--solve`` the longest length or largest micro batch that fits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from trials.contract import Knobs, ModelSpec
from tuner.cli.app import LOOK_CLOSER, app, example
from tuner.cli.declared import with_settings
from tuner.cli.estimate_job import EstimateJob, estimate_job
from tuner.cli.estimate_view import Shown, emit
from tuner.declared import ESTIMATE, OUTPUT_PANEL
from tuner.errors import ConfigError
from tuner.job.lora import check_lora
from tuner.job.model_source import resolve_local_model
from tuner.job.space import KNOB_RANGES, check_job_limits
from tuner.memory import solve as solving
from tuner.memory.estimator import Estimator, accumulates, fsdp_at, trace, trace_at
from tuner.memory.precision import traced_precision
from tuner.session.options import cli_option, device_memory_size
from tuner.settings import load_settings
from tuner.trace_progress import shown
from tuner.units import parse_size

if TYPE_CHECKING:
    from tuner.job.data_job import DataJob

MAX_CALIBRATION_POINTS = 8
TRACE_MAX_LENGTH = 1024  # longer configs are extrapolated from two short traced lengths (a long trace takes minutes)
SHORT_LENGTHS = (320, 640)  # the lengths traced then: not a model dimension of the presets (the shape scaling)
KERNELS = ("cpu", "cuda")  # whose kernels the trace runs where their memory differs (trials.trace_modes.cuda_kernels)
MiB = 1 << 20
SOLVE = ("max-length", "micro-batch")
CONFIG_PANEL = "Config (default: your baseline's)"  # the knobs of the config estimated
ESTIMATE_PANEL = "Estimate"


def _parse_size(text: str | None) -> int | None:
    """ "40GiB", "512MiB", "2e8" or plain bytes; positive (tuner.units.parse_size is the one parser)."""
    return None if text is None else parse_size(text)


def _calibration_rows(study: str, storage: str | None, model: ModelSpec, world_size: int) -> list[tuple[Knobs, int]]:
    from tuner.storage.store import Store

    store = Store(load_settings(storage=storage).storage)
    store.require_study(study)
    out: list[tuple[Knobs, int]] = []
    for row in store.probes(study, status="ok"):
        cfg = row.config
        if not row.peak_allocated or int(cfg.get("world_size", 1)) != world_size:
            continue
        if (cfg.get("model") or {}).get("source", model.source) != model.source:
            continue
        out.append((Knobs.model_validate(row.knobs), row.peak_allocated))
    if not out:
        raise ConfigError(
            f"study {study!r} has no successful probe of {model.source} at world size {world_size} to calibrate from"
        )
    return out[-MAX_CALIBRATION_POINTS:]


#: where `tuner estimate` means something else than `tuner search` by a declared setting
ESTIMATE_OWN: dict[str, dict[str, Any]] = {
    "model": {
        "default": None,
        "help": "builtin:<preset>, an HF id or a local save_pretrained dir (default: your TRL recipe's "
        "model_name_or_path)",
    },
    "world_size": {"default": 1, "min": 1},
    "global_batch": {
        "min": 1,
        "help": "micro x accumulation x world; without it gradient accumulation is assumed (earlier micro-steps' "
        "grads resident: the larger need)",
    },
    "device_memory": {"help": "e.g. 80GiB: say whether it fits"},
    "storage": {"help": "SQLAlchemy URL of the study"},
}


@app.command(
    "estimate",
    rich_help_panel=LOOK_CLOSER,
    epilog=example(
        "tuner estimate --model builtin:t5-small --micro-batch-size 8 --max-length 512 --zero-stage 2 "
        "--device-memory 16GiB"
    ),
)
@with_settings(ESTIMATE, into="job", overrides=ESTIMATE_OWN)
def estimate(
    job: dict[str, Any],
    micro_batch_size: Annotated[
        int | None,
        typer.Option(
            "--micro-batch-size",
            min=KNOB_RANGES["micro_batch_size"][0],
            max=KNOB_RANGES["micro_batch_size"][1],
            help="default: baseline's",
            rich_help_panel=CONFIG_PANEL,
        ),
    ] = None,
    zero_stage: Annotated[
        int | None,
        typer.Option("--zero-stage", min=0, max=3, help="default: baseline's, else 0", rich_help_panel=CONFIG_PANEL),
    ] = None,
    engine: Annotated[
        str | None, typer.Option("--engine", help="deepspeed (default), fsdp2 or torch", rich_help_panel=CONFIG_PANEL)
    ] = None,
    reshard_after_forward: Annotated[
        bool | None,
        typer.Option(
            "--reshard-after-forward/--no-reshard-after-forward",
            help="FSDP2 (default: baseline's, else on)",
            rich_help_panel=CONFIG_PANEL,
        ),
    ] = None,
    offload_params: Annotated[
        bool | None,
        typer.Option("--offload-params/--no-offload-params", help="FSDP2's CPU offload", rich_help_panel=CONFIG_PANEL),
    ] = None,
    offload_optimizer: Annotated[
        bool | None, typer.Option("--offload-optimizer/--no-offload-optimizer", rich_help_panel=CONFIG_PANEL)
    ] = None,
    offload_param: Annotated[
        bool | None,
        typer.Option(
            "--offload-param/--no-offload-param", help="ZeRO-3's parameter offload", rich_help_panel=CONFIG_PANEL
        ),
    ] = None,
    gradient_checkpointing: Annotated[
        bool | None, typer.Option("--gradient-checkpointing/--no-gradient-checkpointing", rich_help_panel=CONFIG_PANEL)
    ] = None,
    overlap_comm: Annotated[
        bool | None, typer.Option("--overlap-comm/--no-overlap-comm", rich_help_panel=CONFIG_PANEL)
    ] = None,
    contiguous_gradients: Annotated[
        bool | None, typer.Option("--contiguous-gradients/--no-contiguous-gradients", rich_help_panel=CONFIG_PANEL)
    ] = None,
    reduce_bucket_size: Annotated[
        str | None, typer.Option("--reduce-bucket-size", help="elements, e.g. 2e8", rich_help_panel=CONFIG_PANEL)
    ] = None,
    allgather_bucket_size: Annotated[
        str | None, typer.Option("--allgather-bucket-size", rich_help_panel=CONFIG_PANEL)
    ] = None,
    margin: Annotated[
        float,
        typer.Option(
            "--margin", min=0.0, max=0.9, help="safety margin for the verdict", rich_help_panel=ESTIMATE_PANEL
        ),
    ] = 0.10,
    calibrate_from_study: Annotated[
        str | None, typer.Option("--calibrate-from-study", help="fit to its probes", rich_help_panel=ESTIMATE_PANEL)
    ] = None,
    solve: Annotated[
        str | None,
        typer.Option(
            "--solve",
            help="max-length: the longest length that fits at the micro batch; micro-batch: the largest micro "
            "batch at the length (needs --device-memory)",
            rich_help_panel=ESTIMATE_PANEL,
        ),
    ] = None,
    kernels: Annotated[
        str,
        typer.Option(
            "--kernels",
            help="cuda: trace the kernels a GPU runs where their memory differs (fused dropout, attention with a "
            "float bias on the math path); cpu (default): the CPU's, as the emulated device's probes run them",
            rich_help_panel=ESTIMATE_PANEL,
        ),
    ] = "cpu",
    as_json: Annotated[
        bool, typer.Option("--json", help="print JSON instead of a table", rich_help_panel=OUTPUT_PANEL)
    ] = False,
) -> None:
    """Predict the peak device memory per rank of one config, phase by phase, without a GPU.

    Phase by phase (train forward+backward, optimizer step, eval forward, generate) and part by part: a fake-tensor
    trace plus DeepSpeed's model-state arithmetic, optionally calibrated against a study's measured probes. The job is
    read as `tuner search` reads it (--baseline, --training-args, the job flags); the config's knobs are the baseline's
    unless an option names them."""
    if solve is not None and solve not in SOLVE:
        raise ConfigError(f"--solve {solve!r}: choose one of {', '.join(SOLVE)}")
    if kernels not in KERNELS:
        raise ConfigError(f"--kernels {kernels!r}: choose one of {', '.join(KERNELS)}")
    capacity = device_memory_size(job["device_memory"], cli_option)
    if solve is not None and capacity is None:
        raise ConfigError(f"--solve {solve} needs --device-memory (what must it fit in?)")
    job["model"] = _model_of(job)
    spec = resolve_local_model(job["model"])
    knob_options = {
        "micro_batch_size": micro_batch_size,
        "engine": engine,
        "zero_stage": zero_stage,
        "offload_optimizer": offload_optimizer,
        "offload_param": offload_param,
        "gradient_checkpointing": gradient_checkpointing,
        "overlap_comm": overlap_comm,
        "contiguous_gradients": contiguous_gradients,
        "reduce_bucket_size": _parse_size(reduce_bucket_size),
        "allgather_bucket_size": _parse_size(allgather_bucket_size),
        "reshard_after_forward": reshard_after_forward,
        "offload_params": offload_params,
    }
    ej = estimate_job(spec, job, knob_options, _data(job))
    check_job_limits(ej.world_size, ej.global_batch or 0, cli_option)  # the bounds a search's are held to
    if ej.job.lora is not None:
        check_lora(spec, ej.job.lora, cli_option)
    calib = _calibration_rows(calibrate_from_study, job["storage"], spec, ej.world_size) if calibrate_from_study else []
    est, how = _traced(ej, calib, kernels)
    for k, peak in calib:
        est.observe(k, peak)
    knobs = ej.knobs
    solved = _solve(est, knobs, solve, capacity, margin) if solve is not None and capacity is not None else None
    result = est.predict(knobs)
    crash = None
    if ej.data is not None and capacity is not None:
        from tuner.session.crash_line import crash_line

        crash = crash_line(ej.data, ej.job, knobs, ej.world_size, capacity, est, "this config")
    shown = Shown(
        result=result,
        accumulates=est.accumulates(knobs),
        param_count=est.trace.param_count,
        trainable_count=est.trace.trainable_count,
        capacity=capacity,
        margin=margin,
        calibration_probes=len(est.observations),
        calibration_errors=est.errors(),
        header=f"{spec.source} on {ej.world_size} rank(s), {ej.job.describe()}; config from {ej.source}: "
        f"{_describe(knobs)}",
        traced=how,
        solved=solved,
        config=knobs.model_dump(mode="json"),
        data=tuple(ej.data_lines()),
        crash=crash,
        precision=traced_precision(knobs).line(),
    )
    emit(shown, as_json)


#: the data settings `tuner estimate` shares with `tuner search` (tuner.session.options.read_data reads them)
DATA_SETTINGS = (
    "dataset",
    "split",
    "eval_split",
    "input_column",
    "target_column",
    "text_column",
    "tokenizer",
    "padding",
    "max_samples",
)


def _model_of(job: dict[str, Any]) -> str:
    """--model, else the model_name_or_path of their TRL recipe (tuner.session.their_files.named_model)."""
    if job.get("model"):
        return str(job["model"])
    from tuner.session.their_files import named_model

    named = named_model(job.get("baseline"), job.get("training_args"))
    if named is None:
        raise ConfigError(
            "pass --model: the model to estimate (builtin:<preset>, an HF id like google/flan-t5-large, or its "
            "directory); a TRL recipe given as --baseline names its own (model_name_or_path)"
        )
    return named


def _data(job: dict[str, Any]) -> DataJob | None:
    """The user's data, read as `tuner search` reads it (the same cache), or None without --dataset."""
    if job.get("dataset") is None:
        return None
    from tuner.session.options import SearchOptions, read_data

    given = SearchOptions(budget=1.0, model=job["model"], **{k: job[k] for k in DATA_SETTINGS})
    return read_data(given, cli_option, None)


def _traced(ej: EstimateJob, calib: list[tuple[Knobs, int]], kernels: str = "cpu") -> tuple[Estimator, str]:
    """The trace of the config (two lengths, so the length curve can be fitted; long configs from two short
    lengths, extrapolated) and the calibration probes' shapes; how it was taken, in words."""
    k = ej.knobs
    long = k.max_length > TRACE_MAX_LENGTH
    lengths = SHORT_LENGTHS if long else tuple(sorted({max(1, k.max_length // 2), k.max_length}))
    wanted = {trace_at(k, length=n) for n in lengths} if k.engine != "fsdp2" else set()
    wanted |= {trace_at(c) for c, _ in calib if c.engine != "fsdp2"}
    labels = ej.job.max_target_length
    padded = ej.data is not None and ej.data.pads  # the data's batches as the collator pads them
    sharded = [c for c, _ in calib if c.engine == "fsdp2"]
    fsdp = {fsdp_at(c, ej.world_size, accumulates(ej.global_batch, c.micro_batch_size, ej.world_size)) for c in sharded}
    if k.engine == "fsdp2":  # its own points at the traced lengths: FSDP2's memory is traced per config
        acc = accumulates(ej.global_batch, k.micro_batch_size, ej.world_size)
        fsdp |= {fsdp_at(k, ej.world_size, acc, length=n) for n in lengths}
    with shown():  # signs of life on stderr while it traces
        tr = trace(
            ej.model,
            sorted(wanted),
            lora=ej.job.lora,
            label_length=labels,
            evaluation=ej.evaluation,
            padded=padded,
            kernels=kernels,
            fsdp_points=sorted(fsdp),
            fsdp=ej.fsdp,
            trainer=ej.trainer,
        )
    est = Estimator(trace=tr, world_size=ej.world_size, global_batch=ej.global_batch)
    took = f"traced in {tr.trace_s:.1f} s" if tr.trace_s else "traced earlier (read from the trace cache)"
    how = f"{took} with {tr.kernels.upper()} kernels"
    if long:
        how += (
            f"; length {k.max_length:,} extrapolated from lengths {', '.join(map(str, SHORT_LENGTHS))} "
            "(activations ~ a*len + b*len^2 per sample; a trace at the full length takes minutes on CPU)"
        )
    return est, how


def _solve(est: Estimator, knobs: Knobs, solve: str, capacity: int, margin: float) -> str:
    if solve == "max-length":
        n = solving.max_length(est, knobs, capacity, margin, KNOB_RANGES["max_length"][1])
        what = f"the longest max_length that fits at micro batch {knobs.micro_batch_size}"
    else:
        n = solving.max_micro_batch(est, knobs, capacity, margin, KNOB_RANGES["micro_batch_size"][1])
        what = f"the largest micro batch that fits at length {knobs.max_length:,}"
    if n is None:
        return f"{what}: none (even 1 is over {capacity / MiB:,.1f} MiB with the {margin:.0%} margin)"
    return f"{what}: {n:,} (with the {margin:.0%} margin, same estimate)"


def _describe(k: Knobs) -> str:
    parts = [f"micro {k.micro_batch_size}", k.engine_label]
    parts += [
        name for name, on in (("offload", k.offload_optimizer), ("checkpointing", k.gradient_checkpointing)) if on
    ]
    return ", ".join(parts)
