"""A DPO job's step in the memory trace (trials.estimate), as its probe runs it (trials.dpo): the pairs (2 x micro
rows with their completion mask), the frozen reference model built beside the policy (in the engine's precision mode:
fp32 under the plain torch engine's autocast, cast with the module under a DeepSpeed bf16/fp16 engine, as
``prepare_deepspeed`` casts it), and the DPO loss whose reference forward runs under no_grad inside the step."""

from __future__ import annotations

from typing import Any

import torch

from trials.contract import DpoSpec, ModelSpec
from trials.trace_model import build
from trials.trace_modes import Mode


def dpo_step(dpo: DpoSpec | None, spec: ModelSpec, mode: Mode, loss_of: Any) -> tuple[torch.nn.Module | None, Any]:
    """(the reference model, or None; the step's loss): ``loss_of`` unchanged for a job that is not DPO. The
    reference is built under the caller's fake mode and tracker (its parameters count in what is live, not in the
    activations), without the job's adapters (DPOTrainer loads the model again)."""
    if dpo is None:
        return None, loss_of
    from trials.dpo import frozen
    from trials.dpo import loss_of as dpo_loss_of

    reference = None
    if dpo.reference == "model":
        reference = frozen(build(spec, None, mode.dtype if mode.cast_module else None))
    return reference, dpo_loss_of(dpo, reference)


def dpo_batch(dpo: DpoSpec | None, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A DPO job's pairs from a batch of 2 x micro rows (trials.dpo.pairs); the batch as it is otherwise."""
    if dpo is None:
        return batch
    from trials.dpo import pairs

    return pairs(batch, dpo)
