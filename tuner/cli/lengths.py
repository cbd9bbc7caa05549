"""`tuner lengths`: the token lengths of the user's dataset under their tokenizer; -o writes what --lengths reads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.cli.app import LOOK_CLOSER, app, example
from tuner.cli.safe_console import SafeConsole
from tuner.declared import DATA_PANEL, OUTPUT_PANEL
from tuner.errors import ConfigError
from tuner.job.dataset import DataLengths, DataSource, tokenizer_for
from tuner.job.lengths import IntArray, Quantiles, cut, cut_points, histogram

out_console = SafeConsole(highlight=False, soft_wrap=True)


def _side_lines(name: str, lengths: IntArray) -> list[str]:
    q = Quantiles.of(lengths)
    row = f"{name:<8}{q.count:>10,}{q.p50:>8,}{q.p90:>8,}{q.p99:>8,}{q.p999:>8,}{q.max:>8,}{q.mean:>10,.1f}"
    cuts = [cut(lengths, at) for at in cut_points(lengths)]
    said = "; ".join(f">{c.at:,}: {c.samples:.2%} of samples, {c.tokens:.2%} of tokens" for c in cuts)
    return [row, f"  {name} above: {said}" if said else f"  {name}: no cut below the longest worth showing"]


def render(read: DataLengths) -> list[str]:
    """The lines `tuner lengths` prints (plain text: dataset names and columns are user text, never markup)."""
    lengths = read.lengths
    head = f"{'':<8}{'count':>10}{'p50':>8}{'p90':>8}{'p99':>8}{'p99.9':>8}{'max':>8}{'mean':>10}"
    sides = [("inputs", lengths.input)] + ([("targets", lengths.target)] if lengths.target is not None else [])
    lines = [read.describe() + (" (cached)" if read.cached else ""), head]
    notes: list[str] = []
    for name, values in sides:
        row, note = _side_lines(name, values)
        lines.append(row)
        notes.append(note)
    lines += notes
    for name, values in sides:
        lines += ["", f"{name} (tokens per sample, power-of-two bins):", *histogram(values)]
    if read.sampled:
        lines.append(f"(a seeded random sample of {len(lengths):,}: --max-samples; the rest were not read)")
    return lines


@app.command(
    "lengths",
    rich_help_panel=LOOK_CLOSER,
    epilog=example(
        "tuner lengths --dataset data.jsonl --tokenizer tok/ --input-column source --target-column target "
        "-o lengths.tsv"
    ),
)
def lengths_command(
    dataset: Annotated[
        str,
        typer.Option(
            "--dataset", help="save_to_disk folder, data file/folder, or cached hub name", rich_help_panel=DATA_PANEL
        ),
    ],
    tokenizer: Annotated[
        str | None, typer.Option("--tokenizer", help="tokenizer id or directory", rich_help_panel=DATA_PANEL)
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="use this model's own tokenizer", rich_help_panel=DATA_PANEL)
    ] = None,
    split: Annotated[str, typer.Option("--split", help="the split to read", rich_help_panel=DATA_PANEL)] = "train",
    input_column: Annotated[
        str | None, typer.Option("--input-column", help="seq2seq input text column", rich_help_panel=DATA_PANEL)
    ] = None,
    target_column: Annotated[
        str | None, typer.Option("--target-column", help="seq2seq label text column", rich_help_panel=DATA_PANEL)
    ] = None,
    text_column: Annotated[
        str | None, typer.Option("--text-column", help="causal LM text column", rich_help_panel=DATA_PANEL)
    ] = None,
    max_samples: Annotated[
        int | None,
        typer.Option("--max-samples", help="scan a seeded random sample of this many", rich_help_panel=DATA_PANEL),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="write input<TAB>target per sample (what --lengths reads)",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = None,
    progress: Annotated[
        bool,
        typer.Option("--progress/--no-progress", help="a progress bar while tokenizing", rich_help_panel=OUTPUT_PANEL),
    ] = True,
) -> None:
    """Show your samples' token lengths: quantiles, what a cut would truncate, a histogram.

    Inputs and targets, read with the datasets library and your tokenizer, offline; -o writes the per-sample lengths
    that `tuner search --lengths` reads."""
    from tuner.job.dataset import read_lengths
    from tuner.job.lengths import write_tsv
    from tuner.settings import load_settings

    source = DataSource(dataset, split, input_column, target_column, text_column, max_samples)
    read = read_lengths(source, tokenizer_for(tokenizer, model), load_settings().cache_dir, progress=progress)
    for line in render(read):
        out_console.print(line, markup=False)
    if output is not None:
        try:
            write_tsv(read.lengths, output)
        except OSError as err:
            raise ConfigError(f"cannot write {output}: {err.strerror or err}; pick a writable path for -o") from None
        out_console.print(f"wrote {output} ({len(read.lengths):,} samples; --lengths {output} reads it)", markup=False)
