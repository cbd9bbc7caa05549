"""`tuner search --budget 2h ...`: the OOM-aware search with a live progress display and a final summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast, get_args

import optuna
import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from trials.contract import Precision
from tuner.cli.app import app
from tuner.cli.progress import LiveProgress, summary_table
from tuner.errors import ConfigError
from tuner.job.definition import JobFlags
from tuner.python_api import attach_estimate, check_host, check_world_size, real_probe, resolve
from tuner.records import DEFAULT_HEADROOM
from tuner.session.driver import Search
from tuner.session.options import DEFAULT_MODEL, SearchOptions, cli_option, prepare_request
from tuner.storage import Store

console = Console(highlight=False, soft_wrap=True)
if not console.is_terminal:  # logs and pipes: wide rows instead of 80 columns folded
    console = Console(highlight=False, soft_wrap=True, width=200)


@app.command("search")
def search(
    budget: Annotated[
        str, typer.Option("--budget", help="wall-clock budget for the whole search: 90s, 30m, 2h, 1h30m")
    ],
    model: Annotated[
        str, typer.Option("--model", help="builtin:tiny-t5, an HF model id, or a local model directory")
    ] = DEFAULT_MODEL,
    space: Annotated[Path | None, typer.Option("--space", help="search space YAML/TOML (default: built-in)")] = None,
    storage: Annotated[
        str | None, typer.Option("--storage", help="SQLAlchemy URL (default: $TUNER_STORAGE or sqlite:///tuner.db)")
    ] = None,
    study: Annotated[str | None, typer.Option("--study", help="study name; an existing one is resumed")] = None,
    world_size: Annotated[int | None, typer.Option("--world-size", help="ranks per probe (data-parallel GPUs)")] = None,
    device_memory: Annotated[
        str | None, typer.Option("--device-memory", help="memory per rank, e.g. 80GiB (default: the device's)")
    ] = None,
    headroom: Annotated[
        float, typer.Option("--headroom", help="stable = peak <= headroom x device memory")
    ] = DEFAULT_HEADROOM,
    global_batch: Annotated[
        int | None, typer.Option("--global-batch", help="samples per optimizer step, held fixed")
    ] = None,
    n_trials: Annotated[int | None, typer.Option("--n-trials", help="stop exploring after this many probes")] = None,
    baseline: Annotated[
        Path | None, typer.Option("--baseline", help="your current DeepSpeed / HF training-args JSON; probed first")
    ] = None,
    lengths: Annotated[
        Path | None, typer.Option("--lengths", help="file of your samples' token lengths (retained-token objective)")
    ] = None,
    finalists: Annotated[
        int, typer.Option("--finalists", help="best stable configs re-probed longer before the pick")
    ] = 2,
    seed: Annotated[int | None, typer.Option("--seed", help="sampler seed")] = None,
    training_args: Annotated[
        Path | None,
        typer.Option("--training-args", help="your training-args JSON, with --baseline DS_JSON (or name it inside)"),
    ] = None,
    max_length: Annotated[
        int | None, typer.Option("--max-length", min=1, help="your job's input length in tokens (encoder / causal)")
    ] = None,
    max_target_length: Annotated[
        int | None, typer.Option("--max-target-length", min=1, help="your job's seq2seq label length")
    ] = None,
    precision: Annotated[
        str | None, typer.Option("--precision", help="your job's precision: bf16, fp16 or fp32")
    ] = None,
    eval_batch_size: Annotated[
        int | None, typer.Option("--eval-batch-size", min=1, help="your job's per-device eval batch")
    ] = None,
    generate: Annotated[
        bool | None, typer.Option("--generate/--no-generate", help="your job evaluates with predict_with_generate")
    ] = None,
    generation_max_length: Annotated[
        int | None, typer.Option("--generation-max-length", min=1, help="new tokens per eval generate")
    ] = None,
    num_beams: Annotated[int | None, typer.Option("--num-beams", min=1, help="beams per eval generate")] = None,
    lora_r: Annotated[
        int | None, typer.Option("--lora-r", help="a LoRA job: adapters of this rank train, the base is frozen (peft)")
    ] = None,
    lora_alpha: Annotated[int | None, typer.Option("--lora-alpha", help="LoRA alpha (default 8)")] = None,
    lora_dropout: Annotated[float | None, typer.Option("--lora-dropout", help="LoRA dropout (default 0)")] = None,
    lora_target_modules: Annotated[
        str | None, typer.Option("--lora-target-modules", help="q_proj,v_proj (default: peft's for the model)")
    ] = None,
    lora_bias: Annotated[str | None, typer.Option("--lora-bias", help="LoRA bias: none, all, lora_only")] = None,
    estimate: Annotated[
        bool | None,
        typer.Option(
            "--estimate/--no-estimate",
            help="skip configs a memory trace predicts far over budget (default: on for budgets of 10 minutes or more)",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="say what the search would do (job, space, estimate, probes, time); write and probe nothing",
        ),
    ] = False,
) -> None:
    """Find the fastest config that does not run out of memory, by short real probe trainings."""
    options = SearchOptions(
        budget=budget,
        model=model,
        space=space,
        storage=storage,
        study=study,
        world_size=world_size,
        device_memory=device_memory,
        headroom=headroom,
        global_batch=global_batch,
        n_trials=n_trials,
        baseline=baseline,
        lengths=lengths,
        finalists=max(finalists, 0),
        seed=seed,
        training_args=training_args,
        job_flags=JobFlags(
            precision=_precision(precision),
            max_length=max_length,
            max_target_length=max_target_length,
            eval_batch_size=eval_batch_size,
            generate=generate,
            generation_max_length=generation_max_length,
            num_beams=num_beams,
            lora_r=lora_r,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            lora_target_modules=lora_target_modules,
            lora_bias=lora_bias,
        ),
    )
    request, explicit = prepare_request(options, option=cli_option)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if dry_run:
        from tuner.session.plan import plan

        with console.status("tracing one training step for the memory estimate ..."):
            found = plan(request, estimate)
        for line in found.lines(request):
            console.print(Text(line))
        return
    check_world_size(request)  # before the study is written or any probe runs: one line, exit 2
    store = Store(request.storage)
    request, resumed = resolve(request, explicit, store)
    with console.status("checking the devices (GPU type, NCCL preflight) ..."):
        check_host(request, store, resumed)
    runner = Search(request, real_probe)
    console.print(
        f"{'resuming' if resumed else 'new'} study [bold]{escape(request.study_name)}[/] on "
        f"{escape(_safe(request.storage))}: {escape(request.model.source)}, world size {request.world_size}, "
        f"global batch {request.global_batch}"
    )
    held = f"your job (held fixed): {request.job.describe()}; " if request.job is not None else ""
    console.print(Text(f"{held}searching {request.space.size()} configs for {request.objective.unit}"))
    if request.job_changes:
        console.print(
            f"[yellow]the space file searches job settings on purpose: {escape(', '.join(request.job_changes))}; "
            "the pick may change your job's results[/]"
        )
    with console.status("tracing one training step for the memory estimate ..."):
        note = attach_estimate(runner, request, estimate)
    if note:
        console.print(note, style="dim", markup=False)
    job = request.job.model_dump(mode="json") if request.job is not None else None
    progress = LiveProgress(console, runner.deadline, request.objective, request.study_name, job)
    runner.listener = progress
    with progress:
        summary = runner.run()
    console.print(summary_table(summary, request.objective, job))
    if summary.best is None:
        console.print("no stable config found: give a larger --device-memory or --budget, or a smaller space")


def _precision(value: str | None) -> Precision | None:
    if value is None:
        return None
    if value not in get_args(Precision):
        raise ConfigError(f"--precision {value!r}: choose one of {', '.join(get_args(Precision))}")
    return cast(Precision, value)


def _safe(url: str) -> str:
    from tuner.settings import redact_url

    return redact_url(url)
