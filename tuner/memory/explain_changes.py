"""The single changes under which a config's worst batch fits (pure): every knob `tuner search` varies for the
config's engine (issue 40 §3), each with the space file that probes it, on the user's engine and files.

DeepSpeed: truncation (with the share of the data it cuts), gradient checkpointing, a smaller micro batch with the
global batch kept by accumulation, smaller ZeRO buckets (the search's bucket choices), ``overlap_comm`` off (one
reduce bucket instead of two), the optimizer offloaded to the CPU, a higher ZeRO stage. FSDP2: truncation,
checkpointing, a smaller micro batch, ``reshard_after_forward`` on and ``offload_params`` on. Every number is the one
shared estimate's (tuner.memory.estimator); where a change's cost in throughput is not estimated its line says so."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trials.contract import DS_DEFAULT_BUCKET, Knobs
from tuner.errors import TunerError
from tuner.job.lengths import SampleLengths, cut
from tuner.job.padding import BatchShape, Collation
from tuner.memory.breakdown import FORWARD_BACKWARD, OPTIMIZER_STEP
from tuner.memory.estimator import Estimator
from tuner.memory.explain_records import Change
from tuner.memory.solve import largest
from tuner.units import memory_text

#: compute per sample with gradient checkpointing: the forward runs again in the backward, forward 1 + backward 2
#: becomes 1 + 1 + 2 (4/3 the work), so at most 3/4 the throughput
CHECKPOINTING_SPEED = 0.75
NOT_ESTIMATED = "its cost in throughput is not estimated (probe it)"


@dataclass(frozen=True)
class Inputs:
    """What an explanation is of: a config of a job on ``world_size`` ranks with ``capacity`` bytes a rank; the
    data's lengths (None: every batch at the config's max_length); ``global_batch`` kept by a smaller micro batch;
    ``eval_when`` when evaluation first runs, in words (from eval_strategy / eval_steps; None: not stated)."""

    estimator: Estimator
    config: Knobs
    capacity: int
    world_size: int
    lengths: SampleLengths | None = None
    collation: Collation | None = None
    global_batch: int | None = None
    eval_when: str | None = None
    margin: float = 0.10
    traced_lengths: tuple[int, ...] = ()  # the input lengths the trace ran at (longer ones extrapolated)
    bucket_choices: tuple[int, ...] = (10_000_000, 50_000_000, 200_000_000)  # the search's (its default space)


def at(k: Knobs, shape: BatchShape) -> Knobs:
    return k.model_copy(update={"micro_batch_size": shape.batch, "max_length": shape.input_length})


def train_peak(est: Estimator, k: Knobs) -> int:
    """The train step's peak (forward + backward, optimizer step), uncalibrated: what the run meets first; the eval
    phases are reported on their own, as they run only when evaluation does."""
    phases = est.breakdown(k).worst.phases
    return max(p.total for p in phases if p.phase in (FORWARD_BACKWARD, OPTIMIZER_STEP))


def fits(i: Inputs, k: Knobs) -> bool:
    return train_peak(i.estimator, k) * (1 + i.margin) <= i.capacity


def changes(i: Inputs, worst: BatchShape) -> list[Change]:
    """The single changes under which the train step of the worst batch fits (with the margin), ranked by predicted
    throughput (truncation first among equals: it changes the data, so it is listed, never applied silently)."""
    out: list[Change] = []
    for make in MAKERS:
        try:
            found = make(i, worst)
        except TunerError:  # the trace lacks the shape (e.g. an FSDP2 config untraced): not offered
            found = None
        if found is not None:
            out.append(found)
    return sorted(out, key=lambda c: -c.speed)


def _cut(i: Inputs, length: int) -> str:
    if i.lengths is None:
        return ""
    c = cut(i.lengths.input, length)
    return f"; cuts {c.samples:.2%} of samples, {c.tokens:.2%} of input tokens"


def _longest(i: Inputs, k: Knobs, upper: int) -> int | None:
    return largest(lambda n: fits(i, k.model_copy(update={"max_length": n})), upper)


def _truncate(i: Inputs, worst: BatchShape) -> Change | None:
    k = at(i.config, worst)
    length = _longest(i, k, worst.input_length)
    if length is None or length >= worst.input_length:
        return None
    return Change(
        f"truncate inputs at {length:,} tokens{_cut(i, length)}",
        train_peak(i.estimator, k.model_copy(update={"max_length": length})),
        1.0,
        "same compute per kept token; changes your data, so only if you accept the cut",
        f"--max-length {length}",
        changes_job=True,
    )


def _checkpointing(i: Inputs, worst: BatchShape) -> Change | None:
    """Gradient checkpointing; where it alone does not hold the worst batch, with the longest truncation that does
    (longer than truncation alone allows)."""
    if i.config.gradient_checkpointing:
        return None
    k = at(i.config, worst).model_copy(update={"gradient_checkpointing": True})
    basis = "the forward runs again in the backward: 4/3 the compute"
    space = space_arg({"gradient_checkpointing": [True]})
    if fits(i, k):
        return Change("gradient checkpointing", train_peak(i.estimator, k), CHECKPOINTING_SPEED, basis, space=space)
    length = _longest(i, k, worst.input_length)
    if length is None:
        return None
    return Change(
        f"gradient checkpointing + truncate inputs at {length:,} tokens{_cut(i, length)}",
        train_peak(i.estimator, k.model_copy(update={"max_length": length})),
        CHECKPOINTING_SPEED,
        basis + "; the cut changes your data",
        f"--max-length {length}",
        space=space,
        changes_job=True,
    )


def _smaller_micro(i: Inputs, worst: BatchShape) -> Change | None:
    micro = i.config.micro_batch_size
    for m in range(micro - 1, 0, -1):
        if i.global_batch is not None and i.global_batch % (m * i.world_size):
            continue
        k = at(i.config, BatchShape(m, worst.input_length, worst.target_length))
        if fits(i, k):
            acc = f", {i.global_batch // (m * i.world_size)} accumulation steps" if i.global_batch else ""
            return Change(
                f"micro batch {m}{acc} (global batch kept)",
                train_peak(i.estimator, k),
                1.0,
                "same compute per sample; a smaller batch's lower GPU efficiency is not estimated (probe it)",
                space=space_arg({"micro_batch_size": [m]}),
            )
    return None


STAGE_BASIS = {
    1: "same compute; the optimizer state sharded over the ranks",
    2: "same compute; the gradients sharded too (a reduce-scatter instead of an all-reduce)",
    3: "same compute; 1.5x ZeRO-2's communication (params gathered in forward and backward), not estimated",
}


def _zero_stage(i: Inputs, worst: BatchShape) -> Change | None:
    """The lowest ZeRO stage above the config's under which it fits (a higher one shards more, communicates more)."""
    k0 = i.config
    if k0.engine != "deepspeed":
        return None
    for stage in range(k0.zero_stage + 1, 4):
        k = at(k0, worst).model_copy(update={"zero_stage": stage})
        if fits(i, k):
            return Change(
                f"ZeRO stage {stage}",
                train_peak(i.estimator, k),
                1.0,
                STAGE_BASIS[stage],
                space=space_arg({"zero_stage": [stage]}),
            )
    return None


def _buckets(i: Inputs, worst: BatchShape) -> Change | None:
    """The largest of the search's bucket sizes, below the config's, under which it fits: ZeRO-1/2 allocate whole
    reduce buckets (two with overlap_comm) and gather in all-gather buckets; ZeRO-3 its reduce bucket."""
    k0 = i.config
    if k0.engine != "deepspeed" or k0.zero_stage == 0:
        return None
    reduce = k0.reduce_bucket_size or DS_DEFAULT_BUCKET
    gather = k0.allgather_bucket_size or DS_DEFAULT_BUCKET
    names = ("reduce_bucket_size",) if k0.zero_stage == 3 else ("reduce_bucket_size", "allgather_bucket_size")
    now = reduce if k0.zero_stage == 3 else max(reduce, gather)
    for size in sorted((s for s in i.bucket_choices if s < now), reverse=True):
        update = {name: min(size, reduce if name == "reduce_bucket_size" else gather) for name in names}
        k = at(k0, worst).model_copy(update=update)
        if fits(i, k):
            was = ", ".join(f"{name} {elements(getattr(k0, name) or DS_DEFAULT_BUCKET)}" for name in names)
            return Change(
                f"smaller ZeRO buckets: {', '.join(f'{n} {elements(v)}' for n, v in update.items())} (was {was})",
                train_peak(i.estimator, k),
                1.0,
                f"same compute; more, smaller collectives: {NOT_ESTIMATED}",
                space=space_arg({"zero_stage": [k0.zero_stage], **{n: [v] for n, v in update.items()}}),
            )
    return None


def elements(n: int) -> str:
    """A bucket size as DeepSpeed configs write it: 2e8, 5e7; another count with its digits grouped."""
    short = f"{n:.0e}".replace("e+0", "e").replace("e+", "e")
    return short if float(short) == n else f"{n:,}"


def _overlap_off(i: Inputs, worst: BatchShape) -> Change | None:
    """overlap_comm off: ZeRO-1/2 keep one reduce bucket instead of two."""
    k0 = i.config
    if k0.engine != "deepspeed" or k0.zero_stage not in (1, 2) or not k0.overlap_comm:
        return None
    k = at(k0, worst).model_copy(update={"overlap_comm": False})
    if not fits(i, k):
        return None
    return Change(
        "overlap_comm off",
        train_peak(i.estimator, k),
        1.0,
        f"one reduce bucket instead of two; the reduction no longer overlaps the backward: {NOT_ESTIMATED}",
        space=space_arg({"zero_stage": [k0.zero_stage], "overlap_comm": [False]}),
    )


def _offload_optimizer(i: Inputs, worst: BatchShape) -> Change | None:
    k0 = i.config
    if k0.engine != "deepspeed" or k0.zero_stage == 0 or k0.offload_optimizer:
        return None
    k = at(k0, worst).model_copy(update={"offload_optimizer": True})
    if not fits(i, k):
        return None
    return Change(
        "offload the optimizer to the CPU",
        train_peak(i.estimator, k),
        1.0,
        f"the optimizer state and step on the host (DeepSpeed's CPU Adam): slower steps, {NOT_ESTIMATED}",
        space=space_arg({"zero_stage": [k0.zero_stage], "offload_optimizer": [True]}),
    )


def _fsdp_knob(name: str, what: str, basis: str) -> Callable[[Inputs, BatchShape], Change | None]:
    """FSDP2's ``name`` turned on (reshard_after_forward, offload_params), where it fits."""

    def make(i: Inputs, worst: BatchShape) -> Change | None:
        if i.config.engine != "fsdp2" or getattr(i.config, name):
            return None
        k = at(i.config, worst).model_copy(update={name: True})
        if not fits(i, k):
            return None
        return Change(what, train_peak(i.estimator, k), 1.0, basis, space=space_arg({name: [True]}))

    return make


_reshard = _fsdp_knob(
    "reshard_after_forward",
    "FSDP2 reshard_after_forward on",
    f"each block's parameters freed after its forward and gathered again in the backward: {NOT_ESTIMATED}",
)
_offload_params = _fsdp_knob(
    "offload_params",
    "FSDP2 offload_params on",
    f"parameters, gradients and optimizer state on the host, copied in each step: {NOT_ESTIMATED}",
)

MAKERS: tuple[Callable[[Inputs, BatchShape], Change | None], ...] = (
    _truncate,
    _buckets,
    _overlap_off,
    _smaller_micro,
    _zero_stage,
    _offload_optimizer,
    _reshard,
    _offload_params,
    _checkpointing,
)


def space_arg(space: dict[str, list[object]]) -> str:
    """The space file's YAML text holding the change (--space reads a YAML/TOML file)."""
    return ", ".join(f"{k}: [{', '.join(_yaml(v) for v in vs)}]" for k, vs in space.items())


def _yaml(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


__all__ = ["CHECKPOINTING_SPEED", "Inputs", "at", "changes", "fits", "memory_text", "space_arg", "train_peak"]
