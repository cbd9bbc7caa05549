"""What `tuner explain` explains, from the search's request (the job as `tuner search` reads it): the user's config
with the job's lengths and evaluation, the model traced at a few short shapes (checkpointing off and on), the data's
lengths and collation, and when evaluation first runs (tuner.memory.explain takes it from here)."""

from __future__ import annotations

from trials.contract import FsdpSettings, Knobs
from tuner.errors import ConfigError
from tuner.memory.estimator import Estimator, Evaluation, accumulates, fsdp_at, trace, trace_at
from tuner.memory.explain import Inputs
from tuner.memory.trace import FsdpAt
from tuner.search.request import SearchRequest
from tuner.session.memory import evaluation, job_trainer

TRACE_MAX_LENGTH = 1024  # longer inputs are extrapolated from two short traced lengths (a long trace takes minutes)
SHORT_LENGTHS = (320, 640)
TRACE_TIMEOUT_S = 900.0  # a loaded CPU: flan-t5-large's eval and generate traces take minutes


def explain_inputs(request: SearchRequest) -> Inputs:
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
    points = [
        trace_at(config.model_copy(update={"gradient_checkpointing": ckpt}), length=n)
        for n in lengths
        for ckpt in (False, True)
    ]
    tr = trace(
        request.model,
        points,
        fsdp_points=fsdp_points(request, config, lengths),
        fsdp=FsdpSettings.model_validate(request.fsdp) if request.fsdp is not None else None,
        timeout_s=TRACE_TIMEOUT_S,
        label_length=job.max_target_length,
        lora=job.lora,
        evaluation=_traced_evaluation(request),
        padded=request.data is not None and request.data.pads,
        trainer=job_trainer(request),
        evaluate_checkpointed=False,  # eval runs without checkpointing: its phases traced once a length (minutes less)
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
        bucket_choices=tuple(sorted({int(n) for n in request.space.reduce_bucket_size if n})),
    )


def fsdp_points(request: SearchRequest, config: Knobs, lengths: tuple[int, ...]) -> list[FsdpAt]:
    """An FSDP2 config's own points (its memory is traced per config, tuner.memory.fsdp) at the traced lengths, and
    those of each change explain weighs (tuner.memory.explain_changes): checkpointing, reshard_after_forward and
    offload_params on, and a smaller micro batch whose global batch accumulates (``no_sync``'s resident grads: its
    own kind of point, at micro 1 and half the config's). None for another engine."""
    if config.engine != "fsdp2":
        return []
    world, glob = request.world_size, request.global_batch
    variants = [config] + [
        config.model_copy(update={name: True})
        for name in ("gradient_checkpointing", "reshard_after_forward", "offload_params")
        if not getattr(config, name)
    ]
    out = {fsdp_at(k, world, accumulates(glob, k.micro_batch_size, world), length=n) for k in variants for n in lengths}
    if not accumulates(glob, config.micro_batch_size, world):  # a smaller micro batch accumulates
        for micro in sorted({1, max(1, config.micro_batch_size // 2)}):
            out |= {fsdp_at(config, world, True, micro=micro, length=n) for n in lengths}
    return sorted(out)


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
