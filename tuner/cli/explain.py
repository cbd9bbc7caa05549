"""`tuner explain`: why the user's config runs out of memory, by phase, part and rank, matched to the OOM message
they saw, with the smallest changes that fit. The job is read exactly as `tuner search` reads it (the declared
settings, the session's request); the model is traced on CPU (short lengths, extrapolated); nothing is probed."""

from __future__ import annotations

import shlex
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from tuner.cli.app import app
from tuner.cli.declared import settings_of, with_settings
from tuner.cli.explain_view import as_json, lines
from tuner.declared import SEARCH
from tuner.errors import ConfigError
from tuner.memory import oom_message
from tuner.memory.estimator import Estimator, Evaluation, trace
from tuner.memory.explain import Inputs, explain
from tuner.search.request import SearchRequest
from tuner.session.memory import evaluation
from tuner.session.options import CLI, SearchOptions
from tuner.session.session import SearchSession

TRACE_MAX_LENGTH = 1024  # longer inputs are extrapolated from two short traced lengths (a long trace takes minutes)
SHORT_LENGTHS = (320, 640)
TRACE_TIMEOUT_S = 900.0  # a loaded CPU: flan-t5-large's eval and generate traces take minutes


#: where `tuner explain` reads a search setting differently: nothing is searched, so no budget is needed
EXPLAIN_OWN: dict[str, dict[str, Any]] = {"budget": {"default": "1h", "help": "not used: explain probes nothing"}}


@app.command("explain")
@with_settings(SEARCH, into="settings", overrides=EXPLAIN_OWN)
def explain_command(
    settings: dict[str, Any],
    oom_text: Annotated[
        str | None,
        typer.Option("--oom-message", help="the CUDA out-of-memory text you saw, or @file holding it"),
    ] = None,
    as_json_out: Annotated[bool, typer.Option("--json", help="print JSON instead of text")] = False,
) -> None:
    """Explain why your config runs out of device memory on your data: each phase's peak at the worst batch, part
    by part, which phase crosses the memory and when a run would meet it, your OOM message matched to the traced
    allocation of its size, and the smallest changes that fit, each with the search that probes it."""
    oom = oom_message.read(oom_text) if oom_text is not None else None
    request, _ = SearchSession(SearchOptions.of(settings), face=CLI).request()
    inputs = _inputs(request)
    found = explain(inputs, oom)
    if as_json_out:
        typer.echo(as_json(found))
        return
    console = Console(highlight=False, soft_wrap=True, width=100)
    for line in lines(found, _search_command(settings)):
        console.print(Text(line))


def _inputs(request: SearchRequest) -> Inputs:
    base, job = request.baseline, request.job
    if base is None or job is None:
        raise ConfigError("tuner explain needs your config: --baseline (your DeepSpeed JSON) [--training-args]")
    if not request.device_memory:
        raise ConfigError("tuner explain needs --device-memory (what must the config fit in?)")
    config = base.model_copy(
        update={
            "max_length": job.max_length,
            "precision": job.precision,
            "eval_batch_size": job.eval_batch_size,
            "generate": job.generate,
        }
    )
    longest = job.max_length
    lengths = SHORT_LENGTHS if longest > TRACE_MAX_LENGTH else tuple(sorted({max(1, longest // 2), longest}))
    points = [(config.micro_batch_size, n, ckpt, config.precision) for n in lengths for ckpt in (False, True)]
    tr = trace(
        request.model,
        points,
        timeout_s=TRACE_TIMEOUT_S,
        label_length=job.max_target_length,
        lora=job.lora,
        evaluation=_traced_evaluation(request),
    )
    data = request.data
    return Inputs(
        estimator=Estimator(trace=tr, world_size=request.world_size, global_batch=request.global_batch),
        config=config,
        capacity=request.device_memory,
        world_size=request.world_size,
        lengths=data.lengths if data is not None else None,
        collation=data.collation(job.max_length, job.max_target_length) if data is not None else None,
        global_batch=request.global_batch,
        eval_when=eval_when(request),
        traced_lengths=lengths,
    )


def _traced_evaluation(request: SearchRequest) -> Evaluation | None:
    """The job's evaluation traced at one sample a batch: the estimate scales the eval phases per sample to the
    eval batch (as it does every batch it did not trace), and a trace of generate at the eval batch takes minutes."""
    ev = evaluation(request)
    return ev.model_copy(update={"eval_batch_size": 1}) if ev is not None else None


def eval_when(request: SearchRequest) -> str | None:
    """When the job's evaluation first runs, from its training args (eval_strategy / eval_steps), in words."""
    args = (request.baseline_files or {}).get("training_args")
    if not isinstance(args, dict):
        return None
    strategy = str(args.get("eval_strategy") or args.get("evaluation_strategy") or "no")
    samples = len(request.data.lengths) if request.data is not None else None
    if strategy == "no":
        return "never: eval_strategy is no"
    if strategy == "epoch":
        after = f", after {samples:,} samples" if samples else ""
        return f"at the end of the first epoch (eval_strategy: epoch{after})"
    steps = args.get("eval_steps") or args.get("logging_steps")
    if steps and request.global_batch:
        return f"after {steps} steps (eval_strategy: steps, {int(steps) * request.global_batch:,} samples)"
    return f"as eval_strategy {strategy!r} says"


def _search_command(settings: dict[str, Any]) -> str:
    """The `tuner search` of this job (the settings given, as their flags) that probes a change."""
    out = ["tuner", "search"]
    for d in settings_of(SEARCH):
        value = settings.get(d.name)
        if value is None or value is False or value == d.default:
            continue
        flag = d.flag.split("/")[0]
        out += [flag] if value is True else [flag, str(value)]
    return " ".join(shlex.quote(a) for a in out)
