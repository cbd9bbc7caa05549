"""The user's Trainer in the memory trace (trials.estimate): the same pieces the probe borrows (trials.trainer_args),
on fake tensors.

``TracedTrainer`` holds what the trace request says of the job's training args (``{"args", "seq2seq",
"eval_held_batches", "deepspeed_optimizer"}``): the probe's TrainingArguments are built once per traced mode, their
optimizer steps the traced step (over the model's parameters for the plain torch engine, over fp32 masters as a
DeepSpeed bf16/fp16 engine hands them to a client optimizer), their compute_loss runs the forward (label smoothing),
their eval loop keeps its logits. ``optimizer_bytes`` measures the optimizer's state in both layouts the engines give
it: per parameter (the plain torch engine, FSDP2's shards, ZeRO-0 in fp32) and per element of a flat fp32 partition
(ZeRO-1/2/3, and ZeRO-0's bf16/fp16 optimizers), which tuner.memory.states reads instead of Adam's 8 bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from trials.contract import DpoSpec, TrlHead
from trials.contract_job import PaddingFree
from trials.trainer_args import build_optimizer, checkpointing_kwargs, optimizer_over, prepare_model, their_args

FLAT_ELEMENTS = 1 << 16  # a flat partition's size for the per-element state (any size: the states are linear in it)


@dataclass
class TracedTrainer:
    """The job's training args in a trace; empty: a job without them (AdamW, the model's loss: as before)."""

    args: dict[str, Any] | None = None
    seq2seq: bool = False
    eval_held_batches: int = 0
    deepspeed_optimizer: bool = False  # the DeepSpeed JSON has an optimizer section: DeepSpeed's Adam runs, not theirs
    compiled: bool = False  # their accelerate config compiles the model (the trace runs eager kernels: said)
    padding_free: PaddingFree | None = None  # a TRL SFT recipe's padding-free batches (trials.data.flattened)
    dpo: DpoSpec | None = None  # a DPO job's step (trials.dpo): the pairs, the reference model
    trl_head: TrlHead | None = None  # TRL's fused LM head (trials.trl_head); None: the full logits
    built: dict[tuple[str, bool], Any] = field(default_factory=dict)

    @classmethod
    def of(cls, request: Mapping[str, Any] | None) -> TracedTrainer:
        if not request:
            return cls()
        return cls(
            args=request.get("args"),
            seq2seq=bool(request.get("seq2seq")),
            eval_held_batches=int(request.get("eval_held_batches") or 0),
            deepspeed_optimizer=bool(request.get("deepspeed_optimizer")),
            compiled=bool(request.get("compiled")),
            padding_free=request.get("padding_free"),
            dpo=DpoSpec.model_validate(request["dpo"]) if request.get("dpo") else None,
            trl_head=TrlHead.model_validate(request["trl_head"]) if request.get("trl_head") else None,
        )

    def training_args(self, precision: str, checkpointing: bool) -> Any | None:
        """The probe's TrainingArguments for a traced mode (built outside fake mode, once), None without args."""
        if self.args is None:
            return None
        key = (precision, checkpointing)
        if key not in self.built:
            with _real_tensors():
                self.built[key] = their_args(
                    self.args,
                    seq2seq=self.seq2seq,
                    micro_batch_size=1,
                    eval_batch_size=None,
                    precision=precision,
                    checkpointing=checkpointing,
                    cuda=False,
                )
        return self.built[key]

    def optimizer_args(self, args: Any | None) -> Any | None:
        """The arguments whose optimizer the engine runs: none when DeepSpeed runs its own section (its Adam)."""
        return None if self.deepspeed_optimizer else args


def prepared(model: torch.nn.Module, args: Any | None, checkpointing: bool) -> None:
    """The model as the probe prepares it: their Trainer's model settings, checkpointing with their keywords."""
    prepare_model(model, args)
    if checkpointing:
        from trials.engine import enable_checkpointing

        enable_checkpointing(model, checkpointing_kwargs(args) or {"use_reentrant": False})


def optimizer_factory(
    model: torch.nn.Module, args: Any | None
) -> Callable[[list[torch.Tensor], bool], torch.optim.Optimizer]:
    """What builds the traced optimizer (trials.trace_modes.MasterStep): their Trainer's over the model's own
    parameters, their class and keywords over fp32 masters; AdamW (foreach) without training args, as before."""

    def make(params: list[torch.Tensor], masters: bool) -> torch.optim.Optimizer:
        if args is None:
            return torch.optim.AdamW(params, lr=1e-4, foreach=True)
        if masters:
            return optimizer_over(params, args, model, 1e-4)
        return build_optimizer(model, args, 1e-4, cuda=False)

    return make


def optimizer_bytes(model: torch.nn.Module, args: Any | None, tracker: Any) -> tuple[int, float]:
    """The optimizer's state after a step, in bytes: over the model's trainable parameters as they are, and per
    element of a flat fp32 partition. Run on fake tensors under ``tracker`` (trials.memory.LiveTensorTracker)."""
    trainable: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.grad = torch.zeros_like(p)
    opt = optimizer_factory(model, args)(trainable, False)
    before = tracker.live
    opt.step()
    per_param = tracker.live - before
    del opt
    for p in trainable:
        p.grad = None
    flat = torch.zeros(FLAT_ELEMENTS, dtype=torch.float32, requires_grad=True)
    flat.grad = torch.zeros_like(flat)
    opt = optimizer_factory(model, args)([flat], True)
    before = tracker.live
    opt.step()
    per_element = (tracker.live - before) / FLAT_ELEMENTS
    del opt, flat
    return per_param, per_element


@contextlib.contextmanager
def _real_tensors() -> Any:
    """Outside any active fake mode (TrainingArguments read the device with real tensors)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        yield
