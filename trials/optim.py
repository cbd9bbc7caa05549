"""The optimizer a probe's engine builds for the job: the HF Trainer's default (FSDP2 builds it on the shards)."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def client_optimizer(params: Iterable[torch.nn.Parameter], lr: float, cuda: bool) -> torch.optim.Optimizer:
    """The optimizer the HF Trainer builds when the job names none (TrainingArguments.optim's default
    adamw_torch_fused; the fused kernel on CUDA, the plain one where fused does not run)."""
    return torch.optim.AdamW(params, lr=lr, fused=True if cuda else None)
