"""`tuner doctor`: the known traps of an existing setup, ranked by the bytes each puts at stake (with --model: the
estimate `tuner estimate` prints, part by part), each with what to try and how `tuner search` would test it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from tuner.cli.app import WORKFLOW, app, example
from tuner.cli.safe_console import SafeConsole
from tuner.declared import JOB_PANEL, OUTPUT_PANEL
from tuner.errors import BaselineError, ConfigError
from tuner.memory.precision import traced_precision

if TYPE_CHECKING:
    from tuner.interop.baseline import Baseline
    from tuner.interop.doctor import Basis, Finding

out_console = SafeConsole(highlight=False, soft_wrap=True)


def _training_args_fields() -> tuple[frozenset[str] | None, str | None]:
    """The keys this host's Seq2SeqTrainingArguments takes and transformers' version (None: not installed)."""
    try:
        import dataclasses

        import transformers
    except ImportError:
        return None, None
    fields = frozenset(f.name for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments))
    return fields, transformers.__version__


def _basis(
    model: str, ds_config: Path | None, training_args: Path | None, world_size: int | None, version: str | None
) -> Basis | None:
    """The setup estimated as `tuner estimate --model M --baseline F [--training-args A] --world-size N` estimates
    it (the same job, knobs and trace): the findings' numbers are that command's parts. The training args alone
    (naming their DeepSpeed file, or none) are the baseline file, as `tuner estimate --baseline ARGS` reads them.
    None when the ledger refuses the files (the findings say why; `tuner estimate` would refuse them too)."""
    from tuner.cli.estimate import _traced
    from tuner.cli.estimate_job import estimate_job
    from tuner.interop.doctor import Basis
    from tuner.job.model_source import resolve_model

    spec = resolve_model(model)
    if ds_config is not None:
        settings = {"baseline": ds_config, "training_args": training_args, "world_size": world_size}
    else:
        settings = {"baseline": training_args, "training_args": None, "world_size": world_size}
    try:
        ej = estimate_job(spec, {**settings, "transformers_version": version}, {}, None)
    except BaselineError:
        return None
    est, how = _traced(ej, [])
    return Basis(est, ej.knobs, f"{spec.source} on {ej.world_size} rank(s), {ej.job.describe()}; {how}")


@app.command(
    "doctor",
    rich_help_panel=WORKFLOW,
    epilog=example("tuner doctor --ds-config ds_config.json --training-args training_args.json --oom-message @oom.txt"),
)
def doctor(
    ds_config: Annotated[
        Path | None, typer.Option("--ds-config", help="your DeepSpeed JSON", rich_help_panel=JOB_PANEL)
    ] = None,
    training_args: Annotated[
        Path | None,
        typer.Option(
            "--training-args", help="your TrainingArguments as JSON (args.to_json_string())", rich_help_panel=JOB_PANEL
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="builtin:<preset>, an HF id or a local dir: each finding then carries its bytes from the estimate "
            "(tuner estimate's trace: seconds for a small model, minutes for a large one on CPU)",
            rich_help_panel=JOB_PANEL,
        ),
    ] = None,
    world_size: Annotated[
        int | None,
        typer.Option(
            "--world-size", min=1, help="ranks the job runs on (with --model; default 1)", rich_help_panel=JOB_PANEL
        ),
    ] = None,
    oom_message: Annotated[
        str | None,
        typer.Option(
            "--oom-message",
            help="the PyTorch OOM text you saw (or @file): qualifies each finding by it",
            rich_help_panel=JOB_PANEL,
        ),
    ] = None,
    transformers_version: Annotated[
        str | None,
        typer.Option(
            "--transformers-version",
            help="the transformers release your training runs on (default: this host's): 'auto' is filled as its "
            "Trainer fills it, and DeepSpeed (this host's) judges the result",
            rich_help_panel=JOB_PANEL,
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the findings as JSON", rich_help_panel=OUTPUT_PANEL)
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="exit 1 when there is any warning (for CI)", rich_help_panel=OUTPUT_PANEL)
    ] = False,
) -> None:
    """Check your DeepSpeed JSON and training args for the known out-of-memory traps.

    The findings are ranked by the bytes at stake (with --model, from the same estimate as `tuner estimate`); each
    says what to try and how `tuner search` would test it."""
    import os

    from tuner.interop.baseline_files import file_kind, read_json
    from tuner.interop.doctor import diagnose, visible_gpus
    from tuner.memory.oom_message import read as read_oom

    if ds_config is None and training_args is None:
        raise ConfigError("give --ds-config FILE and/or --training-args FILE")
    if transformers_version is not None:
        from tuner.interop.trainer_fill import checked_version
        from tuner.session.options import cli_option

        checked_version(transformers_version, cli_option)
    if world_size is not None and model is None:
        raise ConfigError("--world-size goes with --model (it sizes the estimate behind each finding)")
    ds = read_json(ds_config, "DeepSpeed config") if ds_config is not None else None
    hf = read_json(training_args, "training-args file") if training_args is not None else None
    if ds is not None and file_kind(ds) != "deepspeed":
        raise BaselineError(f"{ds_config} looks like training args, not a DeepSpeed config; pass it as --training-args")
    if hf is not None and training_args is not None and isinstance(hf.get("deepspeed"), str) and ds is None:
        ds_path = Path(hf["deepspeed"])
        ds = read_json(ds_path if ds_path.is_absolute() else training_args.parent / ds_path, "DeepSpeed config")
    oom = read_oom(oom_message) if oom_message is not None else None
    env = dict(os.environ)
    accepted, version = _training_args_fields() if hf is not None else (None, None)
    basis = None
    if model is not None:  # the same files, read as `tuner estimate --baseline` reads them
        basis = _basis(model, ds_config, training_args, world_size, transformers_version)
    baseline, findings = diagnose(
        ds,
        hf,
        env=env,
        gpus=visible_gpus(env),
        accepted=accepted,
        transformers_version=version,
        basis=basis,
        oom=oom,
        trainer=transformers_version,
        schedule=_schedule_verdict,
    )
    warnings = sum(f.severity == "warn" for f in findings)
    if as_json:
        typer.echo(json.dumps(_as_json(baseline, findings, basis), indent=2))
    else:
        _print(baseline, findings, basis, warnings)
    if strict and warnings:
        raise typer.Exit(1)


def _schedule_verdict(ds: Any) -> tuple[str | None, str] | None:
    """This host's DeepSpeed on the scheduler of ``ds`` (tuner.probing.schedule_check: a subprocess, ~2 s)."""
    from tuner.probing.schedule_check import check_schedule

    verdict = check_schedule(ds)
    return (verdict.refusal, verdict.deepspeed) if verdict is not None else None


def _as_json(baseline: Baseline | None, findings: list[Finding], basis: Basis | None) -> dict[str, Any]:
    estimate = None
    if basis is not None:
        estimate = {
            "of": basis.described,
            "config": basis.knobs.model_dump(mode="json"),
            "per_rank": True,
            "calibrated": False,
            "not_covered": basis.estimator.breakdown(basis.knobs).not_covered,
            "precision_traced": traced_precision(basis.knobs).line(),
        }
    return {
        "knobs": baseline.knobs if baseline else None,
        "estimate": estimate,
        "ranked_by": "nbytes: the bytes at stake on one rank from the estimate, largest first; findings without "
        "one after (their 'number' says why)",
        "findings": [f.to_dict() for f in findings],
    }


def _print(baseline: Baseline | None, findings: list[Finding], basis: Basis | None, warnings: int) -> None:
    if baseline is not None:
        k = baseline.knobs
        engine = {"deepspeed": f"ZeRO-{k.get('zero_stage', 0)}", "fsdp2": "FSDP2"}.get(k["engine"], "plain torch (DDP)")
        out_console.print(
            f"setup: {engine}, micro batch {k['micro_batch_size']} x accumulation "
            f"{baseline.gradient_accumulation_steps}, {k['precision']}"
            f"{', optimizer offload' if k.get('offload_optimizer') else ''}"
            f"{', parameter offload' if k.get('offload_params') else ''}"
            f"{', overlap_comm' if k.get('overlap_comm') and k.get('zero_stage') else ''}",
            markup=False,
        )
    if basis is not None:
        out_console.print(f"numbers: the estimate of {basis.described} (per rank, uncalibrated)", markup=False)
        out_console.print(traced_precision(basis.knobs).line(), markup=False)
    out_console.print("ranked by the bytes at stake, largest first; findings without a number after them")
    for f in findings:
        style = "bold yellow" if f.severity == "warn" else "cyan"
        out_console.print(f"[{style}]{f.severity}[/] {escape(f.title)}  [dim]({escape(f.code)})[/]")
        out_console.print(f"  number: {f.number}", markup=False)
        if f.not_covered:
            out_console.print(f"  not covered: {f.not_covered}", markup=False)
        if f.oom:
            out_console.print(f"  your OOM: {f.oom}", markup=False)
        out_console.print(f"  why: {f.why}", markup=False)
        out_console.print(f"  try: {f.fix}", markup=False)
        if f.search:
            search = f.search.replace("\n", "; ")
            out_console.print(f"  tuner search: {search}", markup=False)
    if basis is not None:
        out_console.print(basis.estimator.breakdown(basis.knobs).not_covered, markup=False)
    out_console.print(
        f"{warnings} warning(s), {len(findings) - warnings} note(s). `tuner search --baseline "
        "FILE` probes this setup as trial 0 and the space knobs above against it."
    )
