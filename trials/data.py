"""A probe's batches: every row at one input length (and label length), random ids, a fixed seed; at the job's
max_length for a fixed-shape probe, at the shapes of ProbeConfig.batches with data. ``batch_dims`` reads a built
batch's shape back (what the probe reports it ran)."""

from __future__ import annotations

import torch

from trials.contract import BatchDims


def worst_case_batch(
    batch_size: int,
    max_length: int,
    vocab_size: int,
    *,
    seed: int = 0,
    encoder_decoder: bool = True,
    device: torch.device | str = "cpu",
    label_length: int | None = None,
    padded: bool = False,
) -> dict[str, torch.Tensor]:
    """One batch whose every row is max_length long (labels: ``label_length``, default max_length, for a seq2seq
    model; a causal LM's labels are its inputs): no padding to skip, the largest activations.

    Ids avoid the special ids 0-2 (pad, eos, unk in T5 vocabularies) so no position is masked out of the loss.
    ``padded``: the last row's last input position is padding, as a collator pads a shorter sample (mask 0, and a
    causal LM's label -100 there): the memory of a padded batch, whose mask a causal LM must build.
    """
    gen = torch.Generator().manual_seed(seed)
    low = 3 if vocab_size > 3 else 0
    input_ids = torch.randint(low, vocab_size, (batch_size, max_length), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    if encoder_decoder:
        labels = torch.randint(low, vocab_size, (batch_size, label_length or max_length), generator=gen)
    else:
        labels = input_ids.clone()
    if padded and max_length > 1:
        attention_mask[-1, -1] = 0
        input_ids[-1, -1] = 0
        if not encoder_decoder:
            labels[-1, -1] = -100
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    return {k: v.to(device) for k, v in batch.items()}


def batch_dims(batch: dict[str, torch.Tensor], encoder_decoder: bool) -> BatchDims:
    """The shape of a built batch, read from its tensors (labels only for a seq2seq model: a causal LM's are its
    inputs)."""
    target = int(batch["labels"].shape[1]) if encoder_decoder else None
    padded = bool((batch["attention_mask"] == 0).any())
    return BatchDims(input_length=int(batch["input_ids"].shape[1]), target_length=target, padded=padded)
