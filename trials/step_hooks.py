"""What the user's Trainer does around each micro-step, from their TrainingArguments (transformers 5.25's
Trainer.training_step / _inner_training_loop):

- ``torch_empty_cache_steps``: the device cache emptied (accelerate's ``clear_device_cache``) in every micro-step of
  an optimizer step whose number is a multiple of N (``state.global_step % N == 0``);
- ``average_tokens_across_devices`` on several ranks: each accumulation cycle's count of label tokens all-reduced
  over the ranks before the loss is scaled by it (``get_batch_samples``).

A probe runs them in its memory window and its timed window alike, so their memory and their time are measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trials.trainer_args import averages_tokens, empty_cache_steps

IGNORE_INDEX = -100  # labels the loss ignores (the collators' padding)


@dataclass
class StepHooks:
    """The hooks of one rank; the default does nothing (a job without these arguments)."""

    empty_every: int | None = None
    average_tokens: bool = False
    device: torch.device | None = None
    optimizer_steps: int = 0
    emptied: int = 0  # how many times the cache was emptied (what a test reads)
    reduced: int = 0  # how many token counts were all-reduced

    @classmethod
    def of(cls, args: Any | None, device: torch.device, world_size: int) -> StepHooks:
        return cls(empty_cache_steps(args), averages_tokens(args, world_size), device)

    def before(self, batch: dict[str, torch.Tensor]) -> None:
        """Before a micro-step: the Trainer's token count over the ranks (a scalar all-reduce)."""
        if self.average_tokens and "labels" in batch:
            count = (batch["labels"] != IGNORE_INDEX).sum().to(self.device)
            torch.distributed.all_reduce(count)
            self.reduced += 1

    def after(self, boundary: bool) -> None:
        """After a micro-step (``boundary``: it ended with an optimizer step): the cache emptied as their Trainer
        empties it."""
        if self.empty_every is not None and self.optimizer_steps % self.empty_every == 0:
            from accelerate.utils.memory import clear_device_cache

            clear_device_cache()
            self.emptied += 1
        if boundary:
            self.optimizer_steps += 1
