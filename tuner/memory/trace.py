"""What the fake-tensor trace reports (trials/estimate.py writes exactly this JSON), and running it in a subprocess
(tuner/ never imports torch)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trials.contract import DpoSpec, FsdpSettings, Knobs, LoraSpec, ModelSpec, TrlHead
from trials.contract_job import PaddingFree
from tuner.memory.precision import traced_precision
from tuner.memory.states import ADAM, OptimizerState

#: one traced shape: (micro batch, max_length, gradient checkpointing, precision, cast_module); cast_module: the
#: module itself in the half precision (DeepSpeed bf16/fp16), else fp32 weights under autocast (tuner.memory.precision)
TraceAt = tuple[int, int, bool, str, bool]


def trace_at(knobs: Knobs, micro: int | None = None, length: int | None = None) -> TraceAt:
    """The traced shape of a config, in the precision mode its engine runs (at ``micro`` / ``length`` if given)."""
    return (
        knobs.micro_batch_size if micro is None else micro,
        knobs.max_length if length is None else length,
        knobs.gradient_checkpointing,
        knobs.precision,
        traced_precision(knobs).cast_module,
    )


#: one traced FSDP2 config: (micro batch, max_length, checkpointing, precision, reshard_after_forward,
#: offload_params, world size, accumulates): FSDP2's memory depends on all of them (trials.trace_fsdp)
FsdpAt = tuple[int, int, bool, str, bool, bool, int, bool]


def shard_world(knobs: Knobs, world_size: int) -> int:
    """The ranks an FSDP2 config shards its parameters over: the world, or a replica's under HSDP
    (``dp_replicate_size``): its memory per rank is plain FSDP2's at that world (a replica holds the same shards; the
    all-reduce across replicas is in place). Traced and matched at this world size."""
    return world_size // (knobs.dp_replicate_size or 1)


def fsdp_at(
    knobs: Knobs, world_size: int, accumulates: bool, micro: int | None = None, length: int | None = None
) -> FsdpAt:
    """The traced FSDP2 config of ``knobs`` (at ``micro`` / ``length`` if given), on the ranks it shards over
    (``shard_world``: HSDP's replica)."""
    world_size = shard_world(knobs, world_size)
    return (
        knobs.micro_batch_size if micro is None else micro,
        knobs.max_length if length is None else length,
        knobs.gradient_checkpointing,
        knobs.precision,
        knobs.reshard_after_forward,
        knobs.offload_params,
        world_size,
        accumulates,
    )


class TracedAllocation(BaseModel):
    """One of the largest storages a traced phase created: the op that asked for it, its shape, dtype and bytes."""

    model_config = ConfigDict(extra="forbid")
    op: str
    shape: list[int]
    dtype: str
    nbytes: int


class Evaluation(BaseModel):
    """What the job's evaluation runs (the trace's eval phases): the eval batch, and a generate of
    ``generation_max_length`` new tokens (None: the label length) over ``num_beams`` beams."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    eval_batch_size: int = Field(ge=1)
    generate: bool = False
    generation_max_length: int | None = Field(None, ge=1)
    num_beams: int = Field(1, ge=1)


class TracePoint(BaseModel):
    model_config = ConfigDict(extra="forbid")
    micro_batch_size: int = Field(ge=1)
    max_length: int = Field(ge=1)
    gradient_checkpointing: bool = False
    precision: str = "fp32"
    # bf16/fp16 run as DeepSpeed runs them (the module cast; True) or as the plain torch engine (fp32 weights under
    # autocast; False); None: traced before the field (autocast, the only mode then)
    cast_module: bool | None = None
    activation_bytes: int = 0  # fwd+bwd peak above params + full grads + optimizer state, grads built during it
    resident_activation_bytes: int | None = None  # the same with the grads resident (an accumulation micro-step)
    # the two peaks above counted from the backward's first parameter grad on (when ZeRO-1/2's hooks allocate their
    # reduce buckets); None: traced before the field (read as the whole peak)
    after_grad_activation_bytes: int | None = None
    resident_after_grad_activation_bytes: int | None = None
    step_temp_bytes: int = 0  # optimizer-step temporaries above params + grads + state
    peak_bytes: int = 0  # the traced plain-torch step's peak (what engine "torch" needs)
    # the eval phases (traces with an Evaluation): peaks above params + optimizer state (no grads), batch included
    eval_batch_size: int | None = None
    eval_bytes: int | None = None  # the eval forward (no grad; loss and logits)
    generate_bytes: int | None = None  # a decode of every row to the generation length (trials.decode)
    generate_cache_bytes: int | None = None  # of which the generation (KV) cache at its largest
    # mixed precision: the low-precision copies of the weights torch.autocast keeps through a forward (and a train
    # step's backward saves): one per matmul weight, independent of batch and length; in every phase's bytes above.
    # A DeepSpeed bf16/fp16 engine runs a half-precision module without autocast and holds none. None: not traced.
    autocast_cache_bytes: int | None = None
    generation_length: int | None = None
    num_beams: int | None = None
    largest: dict[str, list[TracedAllocation]] = Field(default_factory=dict)  # phase -> its largest allocations


class FsdpPoint(BaseModel):
    """One FSDP2 config traced as its probe runs it (trials.trace_fsdp: rank 0 of a fake process group of the world
    size, fake tensors, the emulated device's tracker), in bytes per rank; the phases above ``states_bytes``."""

    model_config = ConfigDict(extra="forbid")
    micro_batch_size: int = Field(ge=1)
    max_length: int = Field(ge=1)
    gradient_checkpointing: bool = False
    precision: str = "fp32"
    reshard_after_forward: bool = True
    offload_params: bool = False
    world_size: int = Field(ge=1)
    accumulates: bool = False  # the step runs 2 micro-steps (no_sync keeps unsharded grads between them)
    refused: str | None = None  # the model cannot be sharded (trials.fsdp.FsdpRefusal): the reason, no bytes
    states_bytes: int = 0  # live at a steady cycle's start: parameter shards + optimizer state on the device
    param_shard_bytes: int = 0  # of which the parameter shards (0 under offload_params: on the host)
    forward_backward_bytes: int = 0  # the cycle's forward+backward peak above the states
    gathered_bytes: int = 0  # of which FSDP2's unsharded (all-gathered) parameters live at that peak
    step_bytes: int = 0  # the optimizer step's peak above the states (grads, clipping and AdamW's temporaries)
    eval_batch_size: int | None = None
    eval_bytes: int | None = None  # the eval forward's peak above the states (the train batch still held)
    generate_bytes: int | None = None  # a decode to the generation length (trials.decode)
    generate_cache_bytes: int | None = None
    generation_length: int | None = None
    num_beams: int | None = None

    def at(self) -> FsdpAt:
        return (
            self.micro_batch_size,
            self.max_length,
            self.gradient_checkpointing,
            self.precision,
            self.reshard_after_forward,
            self.offload_params,
            self.world_size,
            self.accumulates,
        )


class TraceTrainer(BaseModel):
    """The job's training args as the trace runs them (trials.trace_trainer): their optimizer (unless DeepSpeed runs
    its own section), their loss, checkpointing keywords and eval pile; ``args`` None: a job without them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    args: dict[str, Any] | None = None
    seq2seq: bool = False
    eval_held_batches: int = Field(0, ge=0)
    deepspeed_optimizer: bool = False
    compiled: bool = False  # their accelerate config compiles the model (dynamo_config): the trace says it ran eager
    # a TRL SFT recipe's padding-free batches (trials.contract_job.PaddingFree): each micro batch one flattened row
    padding_free: PaddingFree | None = None
    dpo: DpoSpec | None = None  # a DPO job's step (trials.dpo): the pairs, the reference model's forward
    trl_head: TrlHead | None = None  # TRL's fused LM head (trials.trl_head): its tiles, not the full logits


def trace_trainer(
    args: Mapping[str, Any] | None,
    seq2seq: bool,
    eval_held_batches: int,
    deepspeed: Mapping[str, Any] | None,
    compiled: bool = False,
    dpo: DpoSpec | None = None,
    padding_free: PaddingFree | None = None,
    trl_head: TrlHead | None = None,
) -> TraceTrainer | None:
    """What the trace runs of a job's training args (JobSettings' trainer_args, seq2seq_args, eval_held_batches),
    beside their DeepSpeed JSON: an optimizer section there is what DeepSpeed runs (their optim is not read then, as
    their Trainer does); ``dpo``: a DPO job's pairs and reference (trials.dpo); ``padding_free``: an SFT recipe's
    padding-free batches (trials.data.flattened); ``trl_head``: TRL's fused LM head (trials.trl_head); None when there
    is nothing beyond the defaults."""
    if not args and not eval_held_batches and not compiled and dpo is None and padding_free is None and not trl_head:
        return None
    section = isinstance((deepspeed or {}).get("optimizer"), Mapping)
    return TraceTrainer(
        args=dict(args) if args is not None else None,
        seq2seq=seq2seq,
        eval_held_batches=eval_held_batches,
        deepspeed_optimizer=section,
        compiled=compiled,
        dpo=dpo,
        padding_free=padding_free,
        trl_head=trl_head,
    )


class Trace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    param_count: int
    trainable_count: int | None = None  # params that train (a LoRA job's adapters); None: all (older traces)
    param_bytes: int  # as built (fp32)
    largest_param: int  # elements of the largest parameter tensor (ZeRO-3 gathers at least this)
    points: list[TracePoint] = Field(default_factory=list)
    fsdp_points: list[FsdpPoint] = Field(default_factory=list)  # FSDP2 configs (trials.trace_fsdp); none before
    # whose kernels the trace ran where their memory differs: "cpu" (the emulated device's probes) or "cuda" (fused
    # dropout, the math path of attention with a float bias: trials.trace_modes.cuda_kernels)
    kernels: str = "cpu"
    trace_s: float = 0.0
    # the job's optimizer state (trials.trace_trainer.optimizer_bytes): over the trainable parameters, and per element
    # of a flat fp32 partition; None: traced before the fields (Adam's 8 bytes per element)
    optimizer_state_bytes: int | None = None
    optimizer_flat_bytes: float | None = None
    compiled: bool = False  # the job compiles its model (torch_compile): the trace ran eager kernels
    # a DPO job's frozen reference model: its parameters (elements; None: no reference model in the step)
    reference_count: int | None = None
    pairs: bool = False  # a DPO job's trace: every point's rows are 2 x its micro batch (chosen + rejected)
    # traced padding-free (TraceTrainer.padding_free): a point's micro batch of rows is one row of micro x max_length
    # tokens, and the estimator fits over that flattened length (tuner.memory.traced)
    padding_free: PaddingFree | None = None

    def optimizer_state(self) -> OptimizerState:
        if self.optimizer_flat_bytes is None:
            return ADAM
        return OptimizerState(self.optimizer_state_bytes, self.optimizer_flat_bytes)

    def find(self, micro: int, length: int, ckpt: bool, precision: str, cast_module: bool = False) -> TracePoint | None:
        """The point of that shape and precision mode (a trace older than ``cast_module``: its autocast point)."""
        for p in self.points:
            if (p.micro_batch_size, p.max_length, p.gradient_checkpointing, p.precision) == (
                micro,
                length,
                ckpt,
                precision,
            ) and same_mode(p, cast_module):
                return p
        return None


def same_mode(point: TracePoint, cast_module: bool) -> bool:
    """Whether a traced point ran the precision mode wanted (fp32 points serve both; a point traced before the field
    ran autocast, the only mode then, and serves a cast module too: older stored traces read as before)."""
    return point.precision not in ("bf16", "fp16") or point.cast_module is None or point.cast_module == cast_module


def trace(
    model: ModelSpec,
    points: Sequence[TraceAt],
    timeout_s: float = 600.0,
    python: str | None = None,
    label_length: int | None = None,
    lora: LoraSpec | None = None,
    evaluation: Evaluation | None = None,
    padded: bool = False,
    kernels: str = "cpu",
    fsdp_points: Sequence[FsdpAt] = (),
    fsdp: FsdpSettings | None = None,
    trainer: TraceTrainer | None = None,
    evaluate_checkpointed: bool = True,
) -> Trace:
    """Traces one training step per (micro, max_length, checkpointing, precision, cast_module) (``trace_at``) on CPU
    fake tensors, in the precision mode of the engine (tuner.memory.precision); seq2seq
    labels at ``label_length`` (the job's; None: max_length), as the probe pads them; with the job's ``lora``
    adapters on the model as every probe of a LoRA job runs it; with ``evaluation`` the eval forward and generate
    of each point too; ``padded``: batches with the collator's padding (a job with data), as its probes run them;
    ``kernels``: "cuda" for a job that trains on a GPU (its kernels where their memory differs from the CPU's);
    ``fsdp_points``: FSDP2 configs (``fsdp_at``) run as their probe runs them, with the user's ``fsdp`` settings;
    ``trainer``: the job's training args (their optimizer, loss and eval pile); ``evaluate_checkpointed`` False: the
    eval phases traced at the points without checkpointing only (evaluation runs the model in eval mode, where
    checkpointing is off: the same bytes; the estimator reads a checkpointed config's eval phases from them)."""
    request = {
        "trainer": trainer.model_dump(mode="json") if trainer is not None else None,
        "model": model.model_dump(),
        "label_length": label_length,
        "lora": lora.model_dump(mode="json") if lora is not None else None,
        "evaluation": evaluation.model_dump() if evaluation is not None else None,
        "padded": padded,
        "kernels": kernels,
        "points": [
            {"micro_batch_size": m, "max_length": s, "gradient_checkpointing": c, "precision": p, "cast_module": cast}
            | ({"evaluate": False} if c and not evaluate_checkpointed and evaluation is not None else {})
            for m, s, c, p, cast in points
        ],
        "fsdp": fsdp.model_dump(mode="json") if fsdp is not None else None,
        "fsdp_points": [
            {
                "micro_batch_size": m,
                "max_length": s,
                "gradient_checkpointing": c,
                "precision": p,
                "reshard_after_forward": raf,
                "offload_params": off,
                "world_size": n,
                "accumulates": acc,
            }
            for m, s, c, p, raf, off, n, acc in fsdp_points
        ],
    }
    from tuner.memory.trace_run import run_cached, run_request

    flat = {"padding_free": trainer.padding_free} if trainer is not None and trainer.padding_free else {}
    try:  # the points traced before read from the trace cache (tuner.memory.trace_cache), the rest traced now
        return Trace.model_validate(run_cached(request, timeout_s, python, _readable) | flat)
    except ValidationError:  # a cached entry's model-wide numbers do not read: the whole trace again
        return Trace.model_validate(run_request(request, timeout_s, python) | flat)


def _readable(kind: str, point: Mapping[str, Any]) -> bool:
    """Whether a cached point reads as the trace's points do (a corrupt or foreign entry is traced again)."""
    try:
        (FsdpPoint if kind == "fsdp_points" else TracePoint).model_validate(point)
    except ValidationError:
        return False
    return True
