"""`tuner estimate`: the predicted peak device memory of one config, without probing (no GPU needed)."""

from __future__ import annotations

import json
from dataclasses import MISSING
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table

from trials.contract import Knobs, ModelSpec
from tuner.cli.app import app
from tuner.cli.declared import with_settings
from tuner.cli.safe_console import SafeConsole
from tuner.declared import ESTIMATE
from tuner.errors import ConfigError
from tuner.job.batching import accumulation_steps
from tuner.job.lora import LORA_FLAGS, check_lora, lora_spec
from tuner.job.model_source import resolve_model
from tuner.job.space import KNOB_RANGES, check_job_limits
from tuner.memory.estimator import Estimate, Estimator, trace
from tuner.session.options import cli_option
from tuner.settings import load_settings
from tuner.units import parse_size

MAX_CALIBRATION_POINTS = 8
MiB = 1 << 20


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


def _row(table: Table, name: str, nbytes: int, note: str = "") -> None:
    table.add_row(name, f"{nbytes / MiB:,.1f}", note)


#: where `tuner estimate` means something else than `tuner search` by a declared setting
ESTIMATE_OWN: dict[str, dict[str, Any]] = {
    "model": {"default": MISSING, "help": "builtin:<preset>, an HF id or a local save_pretrained dir"},
    "world_size": {"default": 1, "min": 1},
    "global_batch": {
        "min": 1,
        "help": "micro x accumulation x world; without it gradient accumulation is assumed (earlier micro-steps' "
        "grads resident: the larger need)",
    },
    "max_length": {"default": 512},
    "precision": {"default": "fp32"},
    "device_memory": {"help": "e.g. 80GiB: say whether it fits"},
    "storage": {"help": "SQLAlchemy URL of the study"},
}


@app.command("estimate")
@with_settings(ESTIMATE, into="job", overrides=ESTIMATE_OWN)
def estimate(
    job: dict[str, Any],
    micro_batch_size: Annotated[
        int,
        typer.Option(
            "--micro-batch-size", min=KNOB_RANGES["micro_batch_size"][0], max=KNOB_RANGES["micro_batch_size"][1]
        ),
    ],
    zero_stage: Annotated[int, typer.Option("--zero-stage", min=0, max=3)] = 0,
    engine: Annotated[str, typer.Option("--engine", help="deepspeed or torch")] = "deepspeed",
    offload_optimizer: Annotated[bool, typer.Option("--offload-optimizer/--no-offload-optimizer")] = False,
    gradient_checkpointing: Annotated[
        bool, typer.Option("--gradient-checkpointing/--no-gradient-checkpointing")
    ] = False,
    overlap_comm: Annotated[bool, typer.Option("--overlap-comm/--no-overlap-comm")] = False,
    contiguous_gradients: Annotated[bool, typer.Option("--contiguous-gradients/--no-contiguous-gradients")] = True,
    reduce_bucket_size: Annotated[str | None, typer.Option("--reduce-bucket-size", help="elements, e.g. 2e8")] = None,
    allgather_bucket_size: Annotated[str | None, typer.Option("--allgather-bucket-size")] = None,
    margin: Annotated[float, typer.Option("--margin", min=0.0, max=0.9, help="safety margin for the verdict")] = 0.10,
    calibrate_from_study: Annotated[
        str | None, typer.Option("--calibrate-from-study", help="fit to its probes")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Predict the peak device memory per rank of one config: a fake-tensor trace of one training step plus DeepSpeed's
    model-state arithmetic, optionally calibrated against a study's measured probes."""
    world_size, global_batch = int(job["world_size"]), job["global_batch"]
    check_job_limits(world_size, global_batch or 0, cli_option)  # the bounds a search's are held to
    try:
        knobs = Knobs(
            micro_batch_size=micro_batch_size,
            max_length=job["max_length"],
            engine=engine,
            zero_stage=zero_stage,
            precision=job["precision"],
            offload_optimizer=offload_optimizer,
            gradient_checkpointing=gradient_checkpointing,
            overlap_comm=overlap_comm,
            contiguous_gradients=contiguous_gradients,
            reduce_bucket_size=_parse_size(reduce_bucket_size),
            allgather_bucket_size=_parse_size(allgather_bucket_size),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "knobs"
        raise ConfigError(f"{where}: {first['msg']}") from None
    if global_batch is not None and accumulation_steps(global_batch, micro_batch_size, world_size) is None:
        raise ConfigError(
            f"--global-batch {global_batch} is not a whole number of micro batches: give a multiple of "
            f"--micro-batch-size x --world-size = {micro_batch_size * world_size}"
        )
    spec = resolve_model(job["model"])
    lora = lora_spec(*(job[name] for name in LORA_FLAGS), option=cli_option)
    if lora is not None:
        check_lora(spec, lora, cli_option)
    capacity = _parse_size(job["device_memory"])
    calib = _calibration_rows(calibrate_from_study, job["storage"], spec, world_size) if calibrate_from_study else []
    wanted = {(knobs.micro_batch_size, knobs.max_length, knobs.gradient_checkpointing, knobs.precision)}
    wanted |= {(k.micro_batch_size, k.max_length, k.gradient_checkpointing, k.precision) for k, _ in calib}
    tr = trace(spec, sorted(wanted), lora=lora)
    est = Estimator(trace=tr, world_size=world_size, global_batch=global_batch)
    for k, peak in calib:
        est.observe(k, peak)
    result = est.predict(knobs)
    _print(result, est.accumulates(knobs), tr.param_count, est, capacity, margin, as_json, tr.trace_s)


def _print(
    result: Estimate,
    accumulates: bool,
    params: int,
    est: Estimator,
    capacity: int | None,
    margin: float,
    as_json: bool,
    trace_s: float,
) -> None:
    verdict = None if capacity is None else ("fits" if result.calibrated * (1 + margin) <= capacity else "over budget")
    if as_json:
        out: dict[str, Any] = {
            "param_count": params,
            "trainable_count": est.trace.trainable_count,
            "params": result.states.params,
            "grads": result.states.grads,
            "optimizer": result.states.optimizer,
            "buffers": result.states.buffers,
            "activations": result.activations,
            "gradient_accumulation": accumulates,
            "raw": result.raw,
            "calibrated": result.calibrated,
            "calibration": list(result.calibration),
            "calibration_probes": len(est.observations),
            "capacity": capacity,
            "verdict": verdict,
        }
        typer.echo(json.dumps(out))
        return
    trainable = est.trace.trainable_count
    lora = f", {trainable:,} of them LoRA adapters that train" if trainable is not None and trainable < params else ""
    t = Table(title=f"peak device memory per rank ({params / 1e6:,.1f}M params{lora}, traced in {trace_s:.1f} s)")
    t.add_column("part")
    t.add_column("MiB", justify="right")
    t.add_column("")
    _row(t, "params", result.states.params)
    _row(t, "gradients", result.states.grads)
    _row(t, "optimizer state", result.states.optimizer, "host memory" if result.states.optimizer == 0 else "")
    _row(t, "ZeRO buffers", result.states.buffers)
    _row(
        t,
        "activations + temporaries",
        result.activations,
        "fake-tensor trace" + ("; the grads of earlier micro-steps resident" if accumulates else ""),
    )
    _row(t, "estimate", result.raw, "uncalibrated")
    if est.observations:
        a, b, c = result.calibration
        errs = est.errors()
        note = (
            f"fit to {len(errs)} probes: {a:.2f}*states + {b:.2f}*act + {c / MiB:.0f} MiB, "
            f"max err {max(map(abs, errs)):.0%}"
        )
        _row(t, "calibrated estimate", result.calibrated, note)
    if capacity is not None:
        _row(t, "device memory", capacity, f"{verdict} (with {margin:.0%} margin)")
    SafeConsole(highlight=False).print(t)
