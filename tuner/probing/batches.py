"""The batches a probe of a job with data runs (trials.contract.DataBatches), from the user's lengths under their
collator (tuner.job.padding): the memory window at the worst batch one rank can get, the eval at the eval set's worst
batch, the timed steps on micro batches drawn from seeded shuffled epochs, one per rank per step (as each rank's
DistributedSampler draws its own), or in their sampler's order where their training args choose another
(``their_sampler``: transformers' own length grouping, imported only then). Pure but for that: numpy.

The same seed draws the same shapes for every config of one micro batch size (common random numbers: configs are
compared on the same batches); the draw at micro batch m groups the same shuffled order into batches of m.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from trials.contract import BatchDims, DataBatches, JobSettings, Knobs, timed_micro_steps
from tuner.job.lengths import IntArray
from tuner.job.padding import BatchShape, Sampler, draw_batches, worst_batch

if TYPE_CHECKING:
    from tuner.job.data_job import DataJob


def dims(shape: BatchShape) -> BatchDims:
    return BatchDims(
        input_length=shape.input_length,
        target_length=shape.target_length,
        real_tokens=shape.real_tokens,
        padded=shape.padded,
    )


def data_batches(
    data: DataJob,
    knobs: Knobs,
    job: JobSettings,
    *,
    world_size: int,
    measure_steps: int,
    gradient_accumulation_steps: int,
    seed: int = 0,
) -> DataBatches:
    """What a probe of ``knobs`` runs on the user's data: truncated at the knobs' max_length and the job's label
    length (their length limits; the data's longest sample when they truncate nothing), padded as their collator
    pads; ``measure_steps`` timed micro-steps per rank (as trials.contract.timed_micro_steps counts them)."""
    collation = data.collation(knobs.max_length, job.max_target_length)
    micro = knobs.micro_batch_size
    worst = worst_batch(data.lengths, micro, collation)
    eval_worst = None
    if knobs.eval_batch_size is not None or knobs.generate:
        eval_lengths = data.eval_lengths if data.eval_lengths is not None else data.lengths
        eval_worst = worst_batch(eval_lengths, knobs.eval_batch_size or micro, collation)
    steps = timed_micro_steps(measure_steps, gradient_accumulation_steps)
    sampler = their_sampler(job.trainer_args, micro * gradient_accumulation_steps, seed)
    drawn = draw_batches(data.lengths, micro, collation, steps * world_size, seed=seed, sampler=sampler)
    # step s of rank r: batch s * world + r, so consecutive batches of the shuffled order go to the ranks in turn
    timed = [[dims(drawn[s * world_size + r]) for s in range(steps)] for r in range(world_size)]
    return DataBatches(
        worst=dims(worst),
        eval_worst=dims(eval_worst) if eval_worst is not None else None,
        timed=timed,
        seed=seed,
        padding=collation.padding,
    )


def grouped(args: Mapping[str, Any] | None) -> bool:
    """Whether their Trainer batches by length: ``train_sampling_strategy: group_by_length`` (transformers 5),
    ``group_by_length`` (4.x)."""
    args = args or {}
    return bool(args.get("group_by_length")) or args.get("train_sampling_strategy") == "group_by_length"


def their_sampler(args: Mapping[str, Any] | None, group: int, seed: int) -> Sampler | None:
    """Their Trainer's sampler order where it is not a plain shuffle: transformers' own length grouping
    (``trainer_pt_utils.get_length_grouped_indices``, as LengthGroupedSampler calls it with the micro batch x
    accumulation, the longest batch first), or the sequential order; None: a shuffled epoch."""
    args = args or {}
    if grouped(args):

        def by_length(lengths: IntArray, epoch: int) -> IntArray:
            import torch
            from transformers.trainer_pt_utils import get_length_grouped_indices

            generator = torch.Generator().manual_seed(seed + epoch)
            order = get_length_grouped_indices(lengths.tolist(), group, generator=generator)
            return np.asarray(order, dtype=np.int64)

        return by_length
    if args.get("train_sampling_strategy") == "sequential":
        return lambda lengths, _epoch: np.arange(len(lengths), dtype=np.int64)
    return None


def drawn_tokens_per_sample(batches: DataBatches, micro_batch: int) -> tuple[float, float]:
    """(real, padded) input tokens per sample over every rank's timed batches: tokens/s = samples/s x these."""
    shapes = [b for rank in batches.timed for b in rank]
    samples = micro_batch * len(shapes)
    real = sum(b.real_tokens or 0 for b in shapes)
    padded = micro_batch * sum(b.input_length for b in shapes)
    return real / samples, padded / samples


__all__ = ["data_batches", "dims", "drawn_tokens_per_sample", "grouped", "their_sampler"]
