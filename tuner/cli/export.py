"""`tuner export` (a study's best stable config in a tool's format) and `tuner doctor` (known traps of a setup)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tuner.cli.app import app
from tuner.cli.safe_console import SafeConsole
from tuner.errors import BaselineError, ConfigError
from tuner.files import write_atomic

out_console = SafeConsole(highlight=False, soft_wrap=True)
note_console = SafeConsole(stderr=True, highlight=False, soft_wrap=True)

StorageOpt = Annotated[
    str | None, typer.Option("--storage", help="SQLAlchemy URL (default: $TUNER_STORAGE or sqlite:///tuner.db)")
]


def _write(path: Path, text: str) -> None:
    try:
        write_atomic(path, text)
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror or err}; pick a writable path for -o") from None


@app.command("export")
def export(
    study: Annotated[str, typer.Option("--study", help="the study whose best stable config to export")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="json | deepspeed | hf | accelerate | env")] = "deepspeed",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write to FILE instead of stdout")] = None,
    storage: StorageOpt = None,
    transformers_version: Annotated[
        str | None,
        typer.Option(
            "--transformers-version",
            help="your training host's transformers (the hf export names fields as it does; default: this host's)",
        ),
    ] = None,
) -> None:
    """Export the best stable config of a study. With --format accelerate -o FILE the DeepSpeed JSON it points at is
    written next to FILE as FILE-stem.deepspeed.json."""
    from tuner.interop.export import deepspeed_export, layout, measured_knobs
    from tuner.interop.export.accelerate import render_yaml, to_accelerate
    from tuner.session.best import serve_best
    from tuner.session.options import cli_option
    from tuner.settings import load_settings
    from tuner.storage import Store

    store = Store(load_settings(storage=storage).storage, read_only=True)
    served = serve_best(store, study, fmt, option=cli_option, transformers_version=transformers_version)
    best = served.best
    if served.caveat:  # on stderr: `tuner export > ds.json` stays a config
        typer.echo(served.caveat, err=True)
    if output is None:
        typer.echo(served.content, nl=False)
        return
    written = [output]
    if fmt == "accelerate" and best.knobs.get("engine", "deepspeed") == "deepspeed":
        # the accelerate YAML names the DeepSpeed JSON written next to it
        export = served.export_args
        knobs = measured_knobs(best)
        world, accum = export.world_size, export.gradient_accumulation_steps
        ds_path = output.with_name(f"{output.stem}.deepspeed.json").resolve()
        ds = deepspeed_export(
            knobs, world_size=world, gradient_accumulation_steps=accum, baseline=export.baseline, files=export.files
        )
        _write(ds_path, layout.dumps(ds))
        acc = to_accelerate(
            knobs, world_size=world, gradient_accumulation_steps=accum, deepspeed_config_file=str(ds_path)
        )
        _write(output, render_yaml(acc, str(ds_path)))
        written.append(ds_path)
    else:
        _write(output, served.content)
    trial = f"trial {best.trial_number}" if best.trial_number is not None else "a confirmed probe"
    note_console.print(
        f"wrote {', '.join(map(str, written))} ({fmt}, study {study!r}, {trial}, {best.samples_per_s:.3g} samples/s)",
        style="dim",
        markup=False,
    )


def _training_args_fields() -> tuple[frozenset[str] | None, str | None]:
    """The keys this host's Seq2SeqTrainingArguments takes and transformers' version (None: not installed)."""
    try:
        import dataclasses

        import transformers
    except ImportError:
        return None, None
    fields = frozenset(f.name for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments))
    return fields, transformers.__version__


@app.command("doctor")
def doctor(
    ds_config: Annotated[Path | None, typer.Option("--ds-config", help="your DeepSpeed JSON")] = None,
    training_args: Annotated[
        Path | None, typer.Option("--training-args", help="your TrainingArguments as JSON (args.to_json_string())")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the findings as JSON")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="exit 1 when there is any warning (for CI)")] = False,
) -> None:
    """Check an existing setup for the known OOM traps; say what to try and how `tuner search` would test it."""
    import os

    from tuner.interop.baseline_files import file_kind, read_json
    from tuner.interop.doctor import diagnose, visible_gpus

    if ds_config is None and training_args is None:
        raise ConfigError("give --ds-config FILE and/or --training-args FILE")
    ds = read_json(ds_config, "DeepSpeed config") if ds_config is not None else None
    hf = read_json(training_args, "training-args file") if training_args is not None else None
    if ds is not None and file_kind(ds) != "deepspeed":
        raise BaselineError(f"{ds_config} looks like training args, not a DeepSpeed config; pass it as --training-args")
    if hf is not None and training_args is not None and isinstance(hf.get("deepspeed"), str) and ds is None:
        ds_path = Path(hf["deepspeed"])
        ds = read_json(ds_path if ds_path.is_absolute() else training_args.parent / ds_path, "DeepSpeed config")
    env = dict(os.environ)
    accepted, version = _training_args_fields() if hf is not None else (None, None)
    baseline, findings = diagnose(
        ds, hf, env=env, gpus=visible_gpus(env), accepted=accepted, transformers_version=version
    )
    warnings = sum(f.severity == "warn" for f in findings)
    if as_json:
        typer.echo(
            json.dumps(
                {"knobs": baseline.knobs if baseline else None, "findings": [f.to_dict() for f in findings]}, indent=2
            )
        )
    else:
        if baseline is not None:
            k = baseline.knobs
            engine = f"ZeRO-{k['zero_stage']}" if k["engine"] == "deepspeed" else "plain torch (DDP)"
            out_console.print(
                f"setup: {engine}, micro batch {k['micro_batch_size']} x accumulation "
                f"{baseline.gradient_accumulation_steps}, {k['precision']}"
                f"{', optimizer offload' if k['offload_optimizer'] else ''}"
                f"{', overlap_comm' if k['overlap_comm'] and k['zero_stage'] else ''}",
                markup=False,
            )
        for f in findings:
            style = "bold yellow" if f.severity == "warn" else "cyan"
            out_console.print(f"[{style}]{f.severity}[/] {escape(f.title)}  [dim]({escape(f.code)})[/]")
            out_console.print(f"  why: {f.why}", markup=False)
            out_console.print(f"  try: {f.fix}", markup=False)
            if f.search:
                search = f.search.replace("\n", "; ")
                out_console.print(f"  tuner search: {search}", markup=False)
        out_console.print(
            f"{warnings} warning(s), {len(findings) - warnings} note(s). `tuner search --baseline "
            "FILE` probes this setup as trial 0 and the space knobs above against it."
        )
    if strict and warnings:
        raise typer.Exit(1)
