"""A probe's batches: every row at one input length (and label length), random ids, a fixed seed; at the job's
max_length for a fixed-shape probe, at the shapes of ProbeConfig.batches with data. ``batch_dims`` reads a built
batch's shape back (what the probe reports it ran)."""

from __future__ import annotations

import torch

from trials.contract import BatchDims, ProbeConfig
from trials.contract_job import PaddingFree

# a model's keyword inputs: input_ids, attention_mask, labels
Batch = dict[str, torch.Tensor]


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
    padding_free: PaddingFree | None = None,
) -> dict[str, torch.Tensor]:
    """One batch whose every row is max_length long (labels: ``label_length``, default max_length, for a seq2seq
    model; a causal LM's labels are its inputs): no padding to skip, the largest activations.

    Ids avoid the special ids 0-2 (pad, eos, unk in T5 vocabularies) so no position is masked out of the loss.
    ``padded``: the last row's last input position is padding, as a collator pads a shorter sample (mask 0, and a
    causal LM's label -100 there): the memory of a padded batch, whose mask a causal LM must build.
    ``padding_free`` (a causal LM's TRL SFT recipe: tuner.job.packing): the rows flattened as TRL's padding-free
    collator flattens them (``flattened``).
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
    if padding_free is not None and not encoder_decoder:
        batch = flattened(input_ids, padding_free)
    return {k: v.to(device) for k, v in batch.items()}


def flattened(input_ids: torch.Tensor, padding_free: PaddingFree) -> dict[str, torch.Tensor]:
    """The rows of ``input_ids`` as TRL 1.16's padding-free collator (DataCollatorForLanguageModeling with
    padding_free) hands them to the model: one row of every row's tokens, ``position_ids`` restarting at 0 at each
    sequence, labels the ids with -100 where a sequence starts, no attention_mask. Sequences: each row ("rows"), or for
    BFD packing ("bfd") the samples a row holds: a BFD row of the worst batch is full and holds several samples, here
    two (where a sample starts does not change memory; that one does: transformers then builds the row's
    block-diagonal mask, also for a single row)."""
    rows, length = input_ids.shape
    positions = torch.arange(length).repeat(rows, 1)
    if padding_free == "bfd" and length > 1:
        half = length // 2
        positions[:, half:] -= half
    position_ids = positions.reshape(1, -1)
    ids = input_ids.reshape(1, -1)
    labels = ids.clone()
    labels[position_ids == 0] = -100
    return {"input_ids": ids, "labels": labels, "position_ids": position_ids}


def batch_dims(batch: dict[str, torch.Tensor], encoder_decoder: bool, rows: int = 1) -> BatchDims:
    """The shape of a built batch, read from its tensors (labels only for a seq2seq model: a causal LM's are its
    inputs); a padding-free batch (no attention_mask) of ``rows`` rows flattened: each row's length."""
    target = int(batch["labels"].shape[1]) if encoder_decoder else None
    if "attention_mask" not in batch:
        return BatchDims(input_length=int(batch["input_ids"].shape[1]) // rows, target_length=target)
    padded = bool((batch["attention_mask"] == 0).any())
    return BatchDims(input_length=int(batch["input_ids"].shape[1]), target_length=target, padded=padded)


class RankBatches:
    """The batches one rank of a probe builds: at the fixed shape (knobs.max_length, the job's label length) without
    data, else the memory window at the data's worst batch, the eval at the eval set's worst, and the timed steps on
    this rank's drawn shapes (ProbeConfig.batches)."""

    def __init__(self, config: ProbeConfig, rank: int, device: torch.device, vocab: int, encdec: bool) -> None:
        self.config = config
        self.rank = rank
        self.device = device
        self.vocab = vocab
        self.encdec = encdec

    def label_length(self, at: BatchDims | None) -> int:
        """The labels of a batch at ``at`` (None: the fixed shape's, the job's label length)."""
        cfg = self.config
        if at is None:
            return cfg.job.label_length(cfg.knobs.max_length)
        return at.target_length or at.input_length

    def at(self, at: BatchDims | None, seed: int, size: int | None = None) -> dict[str, torch.Tensor]:
        """A batch of ``size`` (default the micro batch) random-id rows at ``at`` (None: the fixed shape); a DPO job's
        of ``size`` pairs: 2 x size rows, chosen then rejected (trials.dpo.pairs)."""
        knobs, dpo = self.config.knobs, self.config.job.dpo
        batch = worst_case_batch(
            (size or knobs.micro_batch_size) * (2 if dpo is not None else 1),  # DPO: chosen + rejected rows
            at.input_length if at is not None else knobs.max_length,
            self.vocab,
            seed=seed,
            encoder_decoder=self.encdec,
            device=self.device,
            label_length=self.label_length(at),
            padded=at is not None and at.padded,
            padding_free=self.config.job.padding_free,
        )
        if dpo is None:
            return batch
        from trials.dpo import pairs

        return pairs(batch, dpo)

    def memory(self) -> dict[str, torch.Tensor]:
        """The memory window's batch: the worst the data makes (every rank at its own worst), else the fixed shape."""
        data = self.config.batches
        return self.at(data.worst if data is not None else None, self.config.seed + self.rank)

    def eval(self, size: int) -> dict[str, torch.Tensor]:
        """The eval forward's / generate's batch of ``size`` rows at the eval set's worst batch (else the fixed
        shape)."""
        data = self.config.batches
        at = data.eval_worst or data.worst if data is not None else None
        return self.at(at, self.config.seed + 1, size)

    def timed(
        self, fixed: dict[str, torch.Tensor], steps: int
    ) -> tuple[list[dict[str, torch.Tensor]], list[BatchDims]]:
        """The timed window's batches, one per micro-step, and the shapes read back from them (empty at a fixed
        shape): the memory window's batch at a fixed shape, else this rank's drawn shapes (one batch per distinct
        shape, built before the clock starts)."""
        data = self.config.batches
        if data is None:
            return [fixed], []
        shapes = data.timed_for(self.rank)
        built: dict[BatchDims, dict[str, torch.Tensor]] = {}
        out = []
        for k in range(steps):
            at = shapes[k % len(shapes)]
            key = at.model_copy(update={"real_tokens": None})
            if key not in built:
                built[key] = self.at(at, self.config.seed + self.rank + 2 + len(built))
            out.append(built[key])
        rows = self.config.knobs.micro_batch_size
        return out, [batch_dims(b, self.encdec, rows) for b in out]
