"""`tuner export`: a study's best stable config in a tool's format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.app import app
from tuner.cli.safe_console import SafeConsole
from tuner.errors import ConfigError
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
            help="your training host's transformers (the exports name fields and fill 'auto' as it does; default: "
            "the study's, else this host's)",
        ),
    ] = None,
) -> None:
    """Export the best stable config of a study. With --format accelerate -o FILE the DeepSpeed JSON it points at is
    written next to FILE as FILE-stem.deepspeed.json."""
    from tuner.interop.export import accelerate_export, deepspeed_export, layout, measured_knobs
    from tuner.interop.export.accelerate import render_yaml
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
            knobs,
            world_size=world,
            gradient_accumulation_steps=accum,
            baseline=export.baseline,
            files=export.files,
            transformers_version=export.transformers_version,
        )
        _write(ds_path, layout.dumps(ds))
        acc = accelerate_export(
            knobs,
            world_size=world,
            gradient_accumulation_steps=accum,
            files=export.files,
            deepspeed_config_file=str(ds_path),
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
