"""The pick of a study: `tuner best` shows it (the JSON record, or with --changes what it changes in your files),
`tuner export` writes it in your tool's format. One code path writes a config for both (``emit``): `best --format F
-o FILE` is `export --format F -o FILE` with best's defaults, kept for the scripts written before export existed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tuner.cli.app import WORKFLOW, app, example
from tuner.cli.safe_console import SafeConsole
from tuner.declared import JOB_PANEL, OUTPUT_PANEL, STORAGE_PANEL
from tuner.errors import ConfigError
from tuner.files import write_atomic

if TYPE_CHECKING:
    from tuner.session.best import ServedBest

note_console = SafeConsole(stderr=True, highlight=False, soft_wrap=True)

FORMATS = "json | deepspeed | hf | accelerate | env | launch | recipe"
StorageOpt = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help="SQLAlchemy URL (default: $TUNER_STORAGE or sqlite:///tuner.db)",
        rich_help_panel=STORAGE_PANEL,
    ),
]
StudyOpt = Annotated[
    str | None,
    typer.Option("--study", help="the study (default: the most recent study)", rich_help_panel=STORAGE_PANEL),
]
OutputOpt = Annotated[
    Path | None,
    typer.Option("--output", "-o", help="write to FILE instead of stdout", rich_help_panel=OUTPUT_PANEL),
]
TransformersOpt = Annotated[
    str | None,
    typer.Option(
        "--transformers-version",
        help="your training host's transformers (the exports name fields and fill 'auto' as it does; default: "
        "the study's, else this host's)",
        rich_help_panel=JOB_PANEL,
    ),
]


def _write(path: Path, text: str) -> None:
    try:
        write_atomic(path, text)
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror or err}; pick a writable path for -o") from None


def _served(storage: str | None, study: str | None, fmt: str, transformers_version: str | None) -> ServedBest:
    from tuner.session.best import serve_best
    from tuner.session.options import cli_option
    from tuner.settings import load_settings
    from tuner.storage import Store

    store = Store(load_settings(storage=storage).storage, read_only=True)
    return serve_best(store, study, fmt, option=cli_option, transformers_version=transformers_version)


def emit(served: ServedBest, fmt: str, output: Path | None) -> None:
    """The pick in ``fmt`` on stdout, or written to ``output`` (accelerate: with the DeepSpeed JSON it points at
    beside it); the caveat of an unconfirmed pick on stderr, so that `tuner export > ds.json` stays a config."""
    if served.caveat:
        typer.echo(served.caveat, err=True)
    if output is None:
        typer.echo(served.content, nl=False)
        return
    best = served.best
    written = [output]
    if fmt == "accelerate" and best.knobs.get("engine", "deepspeed") == "deepspeed":
        written.append(_write_accelerate_pair(served, output))
    else:
        _write(output, served.content)
    trial = f"trial {best.trial_number}" if best.trial_number is not None else "a confirmed probe"
    note_console.print(
        f"wrote {', '.join(map(str, written))} ({fmt}, study {served.study!r}, {trial}, "
        f"{served.throughput.text(served.unit)}, {served.throughput.statistic()})",
        style="dim",
        markup=False,
    )


def _write_accelerate_pair(served: ServedBest, output: Path) -> Path:
    """The accelerate YAML at ``output`` naming the DeepSpeed JSON written next to it; returns the JSON's path."""
    from tuner.interop.export import accelerate_export, deepspeed_export, layout, measured_knobs
    from tuner.interop.export.accelerate import render_yaml

    export = served.export_args
    knobs = measured_knobs(served.best)
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
        nnodes=export.nnodes,
    )
    _write(output, render_yaml(acc, str(ds_path)))
    return ds_path


@app.command("best", rich_help_panel=WORKFLOW, epilog=example("tuner best --study flan-large --changes"))
def best(
    transformers_version: TransformersOpt = None,
    storage: StorageOpt = None,
    study: StudyOpt = None,
    changes: Annotated[
        bool,
        typer.Option(
            "--changes",
            help="list what the export changes in your files (old -> new), not the file",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = False,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help=f"{FORMATS} (as `tuner export`)", rich_help_panel=OUTPUT_PANEL)
    ] = "json",
    output: OutputOpt = None,
) -> None:
    """Show the best stable config of a study, or with --changes what it changes in your own files.

    Without options: the pick as JSON (its knobs, what it measured, where it ran). To write a config file for your
    tool use `tuner export`; --format and -o here do the same as there (kept for scripts)."""
    served = _served(storage, study, fmt, transformers_version)
    if not changes:
        emit(served, fmt, output)
        return
    text = "".join(line + "\n" for line in served.change_lines)  # the caveat, when there is one, is its first line
    if output is None:
        typer.echo(text, nl=False)
        return
    _write(output, text)
    note_console.print(f"wrote the changes of study {served.study!r} to {output}", style="dim", markup=False)


@app.command(
    "export",
    rich_help_panel=WORKFLOW,
    epilog=example("tuner export --study flan-large --format hf -o training_args.tuned.json"),
)
def export(
    *,
    transformers_version: TransformersOpt = None,
    study: Annotated[
        str,
        typer.Option("--study", help="the study whose best stable config to export", rich_help_panel=STORAGE_PANEL),
    ],
    fmt: Annotated[str, typer.Option("--format", "-f", help=FORMATS, rich_help_panel=OUTPUT_PANEL)] = "deepspeed",
    output: OutputOpt = None,
    storage: StorageOpt = None,
) -> None:
    """Write the best stable config of a study in your tool's format: deepspeed, hf, accelerate, env, json or launch.

    Your own files come back with only the tuned knobs changed. With --format accelerate -o FILE the DeepSpeed JSON it
    points at is written next to FILE as FILE-stem.deepspeed.json. `tuner best --changes` lists the changes."""
    emit(_served(storage, study, fmt, transformers_version), fmt, output)
