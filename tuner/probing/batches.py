"""The batches a probe of a job with data runs (trials.contract.DataBatches), from the user's lengths under their
collator (tuner.job.padding): the memory window at the worst batch one rank can get, the eval at the eval set's worst
batch, the timed steps on micro batches drawn from seeded shuffled epochs, one per rank per step (as each rank's
DistributedSampler draws its own). Pure: numpy through tuner.job.padding, no torch.

The same seed draws the same shapes for every config of one micro batch size (common random numbers: configs are
compared on the same batches); the draw at micro batch m groups the same shuffled order into batches of m.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trials.contract import BatchDims, DataBatches, JobSettings, Knobs, timed_micro_steps
from tuner.job.padding import BatchShape, draw_batches, worst_batch

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
    drawn = draw_batches(data.lengths, micro, collation, steps * world_size, seed=seed)
    # step s of rank r: batch s * world + r, so consecutive batches of the shuffled order go to the ranks in turn
    timed = [[dims(drawn[s * world_size + r]) for s in range(steps)] for r in range(world_size)]
    return DataBatches(
        worst=dims(worst),
        eval_worst=dims(eval_worst) if eval_worst is not None else None,
        timed=timed,
        seed=seed,
        padding=collation.padding,
    )


def drawn_tokens_per_sample(batches: DataBatches, micro_batch: int) -> tuple[float, float]:
    """(real, padded) input tokens per sample over every rank's timed batches: tokens/s = samples/s x these."""
    shapes = [b for rank in batches.timed for b in rank]
    samples = micro_batch * len(shapes)
    real = sum(b.real_tokens or 0 for b in shapes)
    padded = micro_batch * sum(b.input_length for b in shapes)
    return real / samples, padded / samples


__all__ = ["data_batches", "dims", "drawn_tokens_per_sample"]
