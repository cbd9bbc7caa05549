"""TRL's fused LM head in the probe and the trace (JobSettings.trl_head), as TRL >= 1.16's trainers run it.

SFTTrainer (sft_trainer.py:1134-1137) and DPOTrainer (dpo_trainer.py:957-962) patch the model's forward with
``trl.trainer.utils.add_fused_lm_head`` (the base model under PEFT; DPO's reference model too, with the default
outputs); called with ``fused_lm_head=True`` the model runs its backbone and ``ChunkedLogProbFunction`` over tiles of
min(tokens, 4096) x 32768 in the compute dtype (forward, and again in the backward with fp32 gradient accumulators),
never the (batch, length, vocabulary) logits. The probe and the trace call TRL's own function and kernel here (they are
not reimplemented): ``fuse`` patches as the trainer does, ``step_loss`` is the micro-step's loss through the head
(SFT: ``compute_loss`` with loss_type nll; DPO: trials.dpo's with ``fused``). A job without
``trl_head`` (TRL not installed beside tuner: tuner.job.trl_head says so) keeps the full logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from trials.contract import DpoSpec, TrlHead
from trials.outcome import ConfigRefused

Loss = Callable[[Any, dict[str, torch.Tensor]], Any]


def _add_fused_lm_head(head: TrlHead) -> Callable[..., None]:
    """TRL's ``add_fused_lm_head`` from this environment, or the ConfigRefused saying it is missing here (the job was
    defined where TRL ``head.version`` is installed)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:
        with unset_fake_temporarily():  # imported with real tensors, also from inside the trace's fake mode
            from trl.trainer.utils import add_fused_lm_head
    except ImportError:
        raise ConfigRefused(
            f"the job runs TRL {head.version}'s fused LM head, but this probe's Python cannot import "
            "trl.trainer.utils.add_fused_lm_head: install the same TRL beside tuner on this host"
        ) from None
    return add_fused_lm_head


def ready(head: TrlHead | None) -> None:
    """Import TRL's head now (the probe: before its emulated device sets the data limit, which TRL's import would
    eat into); where it is missing, ``fuse`` says so later, inside the probe's run."""
    if head is not None:
        with contextlib.suppress(ConfigRefused):
            _add_fused_lm_head(head)


def fuse(head: TrlHead | None, model: torch.nn.Module, reference: torch.nn.Module | None = None) -> None:
    """Patch ``model`` (its base model under PEFT) with TRL's fused LM head and ``head.outputs``, and a DPO
    reference model with the default outputs, as the trainer does before its engine; nothing without ``head``."""
    if head is None:
        return
    add = _add_fused_lm_head(head)
    base = getattr(model, "get_base_model", lambda: model)()  # a PeftModel: its base model, as TRL patches it
    add(base, outputs=head.outputs)
    if reference is not None:
        add(reference)


def sft_loss(module: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """SFTTrainer.compute_loss for loss_type nll (sft_trainer.py:1608-1614): the per-token log-probs through the fused
    head, their negative sum over the labelled tokens' count."""
    outputs = module(**batch, use_cache=False, fused_lm_head=True)
    per_token_loss = -outputs.log_probs  # zero on ignored positions
    return per_token_loss.sum() / torch.as_tensor(outputs.label_mask.sum()).clamp(min=1)


def smoothed(loss: Loss) -> Loss:
    """SFTTrainer.compute_loss with label smoothing (sft_trainer.py:1592-1600): their label smoother's loss over the
    full logits (``loss``: trials.trainer_args), then, for the metrics only, a no-grad forward through the head."""

    def run(module: Any, batch: dict[str, torch.Tensor]) -> Any:
        value = loss(module, batch)
        with torch.no_grad():
            module(**batch, use_cache=False, fused_lm_head=True)
        return value

    return run


def step_loss(head: TrlHead | None, dpo: DpoSpec | None, reference: Any | None, loss: Any, args: Any = None) -> Any:
    """The micro-step's loss: DPO's (through the head with one), SFT's through the head (with their
    ``label_smoothing_factor``: the full logits' smoothed loss and the head's no-grad forward), else ``loss`` (their
    Trainer's, or None: the model's own)."""
    if dpo is not None:
        from trials.dpo import loss_of

        return loss_of(dpo, reference, fused=head is not None)
    if head is None:
        return loss
    return smoothed(loss) if getattr(args, "label_smoothing_factor", 0) else sft_loss
