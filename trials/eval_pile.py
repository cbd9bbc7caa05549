"""The eval forward as the user's Trainer runs it, with the logits it keeps on the device.

Their evaluation loop (transformers 5.25 ``Trainer.evaluation_loop``, ``EvalLoopContainer(do_nested_concat=True)``)
concatenates each eval batch's logits onto those before on the device — ``torch.cat((kept, new))`` per batch — until
``eval_accumulation_steps`` batches moved them to the host (unset: until evaluation ends); with
``prediction_loss_only`` or ``predict_with_generate`` no logits are kept. ``held`` batches (JobSettings.
eval_held_batches) are run so: the pile of ``held - 1`` batches' logits built first (concatenated as the loop
concatenates them), then a real forward with it resident, then its concatenation; 0 or 1 is one forward. Used by the
probe (trials.probe) and the memory trace (trials.estimate) alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: (module, batch) -> (loss, outputs): the Trainer's compute_loss (trials.trainer_args.their_forward)
Forward = Callable[[Any, dict[str, torch.Tensor]], tuple[Any, Any]]


def _plain(module: Any, batch: dict[str, torch.Tensor]) -> tuple[Any, Any]:
    outputs = module(**batch)
    return outputs.loss, outputs


def eval_forward(model: Any, batch: dict[str, torch.Tensor], held: int, forward: Forward = _plain) -> None:
    """One eval step of ``batch`` (no grad, the caller's autocast) as ``forward`` runs it (their label smoothing
    too), with ``held`` batches' logits kept."""
    if held <= 1:
        kept = forward(model, batch) if held == 1 else forward(model, batch)[0]
        del kept
        return
    first = forward(model, batch)[1].logits.detach()
    pile = first
    for _ in range(held - 2):  # the earlier batches' logits, concatenated as the loop concatenates them
        pile = torch.cat((pile, first), dim=0)
    del first
    last = forward(model, batch)[1].logits.detach()  # the last batch's forward, with the pile resident
    pile = torch.cat((pile, last), dim=0)
    del pile, last
