"""Model states per rank: DeepSpeed's ZeRO arithmetic per stage / offload / world size, and the ZeRO buffers by phase.

Model-state bytes per parameter (P params, N ranks; "mixed" = bf16/fp16, whose optimizer keeps an fp32 master copy;
DeepSpeed's ZeRO optimizers clone an fp32 partition even in fp32 training):

======= ================ ================ ==================================================
stage   params           grads            optimizer (Adam m, v [+ fp32 copy])
======= ================ ================ ==================================================
torch   4P               4P               8P (autocast keeps fp32 weights)
0       w P              w P              8P fp32, 12P mixed
1       w P              w P              12P / N
2       w P              w P / N          12P / N
3       w P / N + gather w P / N          12P / N   (gather: none on one rank)
======= ================ ================ ==================================================

w = 2 for bf16/fp16, 4 for fp32. A LoRA job (trainable T < P: adapters on a frozen base) keeps the params column
at P (the base weights once, at the job's precision) and charges the grads and optimizer columns, and the ZeRO-1/2
all-gather, T instead of P: only the adapters get grads and optimizer states. offload_optimizer moves the optimizer
column to host memory, offload_param (ZeRO-3) the params column (the gathered layer stays on the device). ZeRO with
contiguous_gradients (stage 1 or 2) keeps a reduce bucket of ``reduce_bucket_size`` elements (two with overlap_comm),
whatever the model size (DeepSpeed 0.19 ``setup_buckets``); ZeRO-1/2
all-gather updated params in chunks of at most ``allgather_bucket_size`` elements; ZeRO-3 gathers the largest layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trials.contract import DS_DEFAULT_BUCKET, Knobs
from tuner.errors import ConfigError


@dataclass(frozen=True)
class OptimizerState:
    """The job's optimizer state, as the trace measured it (trials.trace_trainer.optimizer_bytes): bytes over the
    trainable parameters as they are (the plain torch engine; ZeRO-0 in fp32), and bytes per element of a flat fp32
    partition (ZeRO-1/2/3 and ZeRO-0's bf16/fp16 optimizers hand the optimizer flat partitions: Adafactor factors
    nothing there). Adam's: 8 bytes per element both ways."""

    per_param: int | None = None  # None: Adam's 8 bytes per trainable parameter
    per_element: float = 8.0

    def over_params(self, trainable: int) -> int:
        return self.per_param if self.per_param is not None else 8 * trainable


ADAM = OptimizerState()


@dataclass(frozen=True)
class StateBytes:
    params: int
    grads: int
    optimizer: int
    buffers: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.buffers


def model_state_bytes(
    knobs: Knobs,
    param_count: int,
    world_size: int = 1,
    largest_param: int | None = None,
    trainable: int | None = None,
    optimizer_state: OptimizerState = ADAM,
) -> StateBytes:
    """DeepSpeed's model-state arithmetic (see the module docstring) for one rank; ``trainable``: the params that
    get grads and optimizer states (a LoRA job's adapters; None: all ``param_count``); ``optimizer_state``: the job's
    optimizer as traced (Adam's m and v by default: the 8 of 8P / 12P below; the 4 of 12P is the fp32 master)."""
    if world_size < 1:
        raise ConfigError(f"world size {world_size} must be at least 1")
    p, n = param_count, world_size
    t = p if trainable is None else min(trainable, p)
    mixed = knobs.precision in ("bf16", "fp16")
    opt = optimizer_state
    if knobs.engine == "torch":
        return StateBytes(params=4 * p, grads=4 * t, optimizer=opt.over_params(t), buffers=0)
    w = 2 if mixed else 4
    stage = knobs.zero_stage
    params = w * p if stage < 3 else math.ceil(w * p / n)
    grads = w * t if stage < 2 else math.ceil(w * t / n)
    if stage == 0:
        optimizer = math.ceil((4 + opt.per_element) * t) if mixed else opt.over_params(t)
    else:
        optimizer = math.ceil((4 + opt.per_element) * t / n)
    if knobs.offload_optimizer:
        optimizer = 0
    if knobs.offload_param:  # ZeRO-3's parameter partitions in host memory (gathered to the device as before)
        params = 0
    reduce = knobs.reduce_bucket_size or DS_DEFAULT_BUCKET
    allgather = knobs.allgather_bucket_size or DS_DEFAULT_BUCKET
    buffers = 0
    if stage in (1, 2):
        buffers += w * min(allgather, t)  # all-gather of the updated partitions, in chunks
        if knobs.contiguous_gradients:  # DeepSpeed 0.19 allocates the full bucket, in the model's dtype
            buffers += w * reduce * (2 if knobs.overlap_comm else 1)
        else:
            buffers += w * min(reduce, t)
    elif stage == 3:
        buffers += zero3_gathered(w, p, n, largest_param, allgather)  # gathered layer / prefetch
        buffers += zero3_reduce_bucket(knobs, w, t)
    return StateBytes(params=params, grads=grads, optimizer=optimizer, buffers=buffers)


def zero3_gathered(w: int, params: int, world_size: int, largest_param: int | None, allgather: int) -> int:
    """ZeRO-3's gathered layer (or prefetch bucket) in the model's dtype; none on one rank, where the partition is the
    whole parameter and DeepSpeed gathers nothing (0.19 partition_parameters.py ``all_gather_coalesced``: every
    partition world size 1 -> ``_no_gather_coalesced``; measured: tiny Llama bf16 on one rank, ZeRO-3 train read
    2.0-3.1% high with it, the 2-rank probes exact)."""
    if world_size == 1:
        return 0
    return w * max(largest_param or 0, min(allgather, params))


def zero3_reduce_bucket(knobs: Knobs, w: int, trainable: int) -> int:
    """ZeRO-3's reduce bucket: with contiguous_gradients one buffer of ``reduce_bucket_size`` elements per comm dtype,
    allocated whole in the optimizer's __init__ (DeepSpeed 0.19 stage3.py, "IPG") however small the model, and
    overlap_comm adds no second one (measured: a tiny Llama, 124k params, on 2 ranks with an 8M-element bucket held
    30.5 MiB more than with 2M, with and without overlap; the estimate had min(bucket, params)); without it, the
    grads waiting in the bucket."""
    reduce = knobs.reduce_bucket_size or DS_DEFAULT_BUCKET
    if knobs.contiguous_gradients:
        return w * reduce
    return w * min(reduce, trainable) * (2 if knobs.overlap_comm else 1)


def zero_order_sound(param_count: int, world_size: int, space_knobs: list[Knobs]) -> bool:
    """True when, by the model-state arithmetic, every higher ZeRO stage needs no more than a lower one for every
    config of ``space_knobs`` (same knobs otherwise) — the condition for ``Frontier(zero_order=True)``."""
    for k in space_knobs:
        if k.engine != "deepspeed":
            continue
        for hi in range(k.zero_stage + 1, 4):
            other = k.model_copy(update={"zero_stage": hi})
            if (
                model_state_bytes(other, param_count, world_size).total
                > model_state_bytes(k, param_count, world_size).total
            ):
                return False
    return True


def zero_stage_need(
    param_count: int,
    world_size: int,
    space_knobs: list[Knobs],
    largest_param: int | None = None,
    trainable: int | None = None,
) -> dict[int, int] | None:
    """The order of ZeRO stages by memory need for this model, world size and space — ``Frontier(stage_need=...)`` —
    or None when no single order holds for every config of the space.

    Stages are ranked by their mean model-state bytes; the order is returned only if, for every pair of the space's
    configs that the frontier would compare under it, the one it says needs more has at least the model-state bytes
    of the other (activations do not depend on the stage).
    """
    from tuner.memory.frontier import DEFAULT_ORDER, needs_at_least

    totals: dict[tuple[Any, ...], tuple[dict[str, Any], int]] = {}
    for k in space_knobs:
        if k.engine != "deepspeed":
            continue
        sig = (
            k.zero_stage,
            k.precision,
            k.offload_optimizer,
            k.offload_param,
            k.reduce_bucket_size,
            k.allgather_bucket_size,
            k.overlap_comm,
            k.contiguous_gradients,
        )
        if sig not in totals:
            base = k.model_copy(
                update={
                    "micro_batch_size": 1,
                    "max_length": 1,
                    "gradient_checkpointing": False,
                    "eval_batch_size": None,
                    "generate": False,
                    "alloc_conf": None,
                }
            )
            states = model_state_bytes(k, param_count, world_size, largest_param, trainable)
            totals[sig] = (base.model_dump(), states.total)
    stages = sorted({sig[0] for sig in totals})
    if len(stages) < 2:
        return None
    mean = {
        s: sum(t for sig, (_, t) in totals.items() if sig[0] == s) / sum(1 for sig in totals if sig[0] == s)
        for s in stages
    }
    ranked = sorted(set(mean.values()))
    need = {s: ranked.index(mean[s]) for s in stages}
    order = {**DEFAULT_ORDER, "zero_stage": "rank"}
    items = list(totals.values())
    for a, ta in items:
        for b, tb in items:
            if a["zero_stage"] != b["zero_stage"] and needs_at_least(a, b, order, need) and ta < tb:
                return None
    return need


# -- ZeRO buffers by phase ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PhaseBuffers:
    """ZeRO's device buffers of one rank (bytes) and the phase each is live in (DeepSpeed 0.19,
    runtime/zero/stage_1_and_2.py and stage3.py). ``StateBytes.buffers`` is the phase-blind sum the stage ordering
    uses; the peak per phase takes these.

    - ``reduce``: the reduce (ipg) bucket(s), live from the first backward on: ZeRO-1/2 with contiguous_gradients
      allocate ``reduce_bucket_size`` elements, two with overlap_comm, in the gradient-accumulation dtype
      (``_gradient_reduction_buffer_dtype``: the model's, bf16 / fp16 under mixed precision unless the user sets
      ``data_types.grad_accum_dtype``; it was charged 4 bytes at ZeRO-1, 9.5-10.8% high on bf16 probes);
    - ``allgather``: ZeRO-1/2 all-gather the updated partitions in the optimizer step only, in chunks of
      ``allgather_bucket_size``; ZeRO-3 gathers the largest layer (or a prefetch bucket) in every phase;
    - ``grad_partition``: the flat fp32 grad partition the ZeRO-1/2 step builds (``flatten_dense_tensors_aligned(
      averaged_gradients)``): stage 2 copies its contiguous grad partition into it; stage 1 in fp32 frees the full
      grads as it fills it (no extra), in bf16/fp16 it is the fp32 cast of the bf16 partition; ZeRO-3 in bf16/fp16
      casts its flat grad partition to fp32 for the step (stage3.py ``_prepare_fp32_grad_for_sub_group``: tiny Llama
      bf16, one rank, micro 2 x 64 with checkpointing, where the step is the peak: 8.0% low without it, 6.7% with);
      in fp32 charging it put t5-mid-2rank-offload's max from 6.9% to 14.0%: not charged;
    - ``offload_staging``: with CPU offload, ZeRO-1/2 keep ``temp_grad_buffer_for_gpu_offload`` on the device, one
      largest parameter at the job's precision;
    - ``partition_grads_in_backward``: whether the model-state grads column (``StateBytes.grads``) is on the device at
      the backward's peak. ZeRO-2 (``partition_gradients``, contiguous_gradients) allocates its contiguous grad
      partition ``grads_in_partition`` at the backward's first bucket reduce (``copy_grads_in_partition``) and drops
      the reference at the backward's end (``_release_ipg_buffers``); the partition's ``param.grad`` views keep it
      until the step. So the partition is live at the backward's peak when a micro-step of the same step ran before
      it (accumulation), or when the reduce bucket holds fewer elements than the trainable params (a reduce, and
      with it a new partition, comes before the backward's end; counted, the larger need); one micro-step whose
      bucket takes every grad reduces only in the epilogue, after the peak: not live. With CPU offload the grads go
      to the host's fp32 buffer (``async_accumulate_grad_in_cpu_via_gpu``) and never form a device partition.
      ZeRO-1 keeps full grads and ZeRO-3 its persistent ``grad_partitions_flat_buffer``: always live.
    """

    reduce: int = 0
    allgather: int = 0
    allgather_in_backward: bool = False
    grad_partition: int = 0
    offload_staging: int = 0
    partition_grads_in_backward: bool = True
    # ZeRO++ hpZ (ZeRO-3, zero_hpz_partition_size h > 1): each parameter's secondary partition over the h ranks of
    # its group (a node's), w * P / h (partition_parameters.py ``_partition_param_sec``), made as the backward
    # releases each parameter and dropped after the optimizer step (stage3.py ``_post_step``:
    # ``invalidate_secondary_tensor``; DeepSpeed 0.19.8 on 4 gloo ranks: none after a step's forward, all after its
    # backward and through the step, and through the next micro-step when the step accumulates): charged to the step,
    # and to the forward+backward of a step that accumulates (``secondary_in_backward``)
    secondary: int = 0
    secondary_in_backward: bool = False

    @property
    def forward_backward(self) -> int:
        gathered = self.allgather if self.allgather_in_backward else 0
        carried = self.secondary if self.secondary_in_backward else 0
        return self.reduce + self.offload_staging + gathered + carried

    @property
    def optimizer_step(self) -> int:
        return self.reduce + self.offload_staging + self.allgather + self.grad_partition


def zero_buffers(
    knobs: Knobs,
    param_count: int,
    world_size: int = 1,
    largest_param: int | None = None,
    trainable: int | None = None,
    accumulates: bool = True,
) -> PhaseBuffers:
    """The ZeRO buffers of one rank by phase (see :class:`PhaseBuffers`); none for plain torch or ZeRO-0.
    ``accumulates``: whether a step runs several micro-steps (unknown: True, the larger need)."""
    p, n = param_count, world_size
    t = p if trainable is None else min(trainable, p)
    stage = knobs.zero_stage
    if knobs.engine == "torch" or stage == 0:
        return PhaseBuffers()
    w = 2 if knobs.precision in ("bf16", "fp16") else 4
    reduce = knobs.reduce_bucket_size or DS_DEFAULT_BUCKET
    allgather = knobs.allgather_bucket_size or DS_DEFAULT_BUCKET
    copies = 2 if knobs.overlap_comm else 1
    if stage == 3:
        hpz = min(knobs.zero_hpz_partition_size or 1, n)
        return PhaseBuffers(
            reduce=zero3_reduce_bucket(knobs, w, t),
            allgather=zero3_gathered(w, p, n, largest_param, allgather),
            allgather_in_backward=True,
            grad_partition=0 if knobs.offload_optimizer or w == 4 else math.ceil(4 * t / n),
            secondary=math.ceil(w * p / hpz) if hpz > 1 else 0,
            secondary_in_backward=accumulates,
        )
    if knobs.contiguous_gradients:
        bucket = w * reduce * copies
    else:
        bucket = w * min(reduce, t)
    partition = math.ceil(4 * t / n)
    mixed = w < 4
    grad_partition = 0 if knobs.offload_optimizer or (stage == 1 and not mixed) else partition
    staging = w * min(largest_param or 0, t) if knobs.offload_optimizer else 0
    return PhaseBuffers(
        reduce=bucket,
        allgather=w * min(allgather, t),
        grad_partition=grad_partition,
        offload_staging=staging,
        partition_grads_in_backward=stage == 1 or (not knobs.offload_optimizer and (accumulates or reduce < t)),
    )
