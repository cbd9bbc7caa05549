"""The crash line: with the user's data and a config, the share of its batches the config cannot hold and when a
shuffled run meets the first (tuner.memory.crash), from the estimate at each batch's padded input length. One
function, read by the dry run (tuner.session.plan) and `tuner estimate`."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from tuner.errors import TunerError

if TYPE_CHECKING:
    from trials.contract import Knobs
    from tuner.job.data_job import DataJob
    from tuner.job.definition import Job
    from tuner.memory.estimator import Estimator


def crash_line(
    data: DataJob, job: Job, config: Knobs, world_size: int, capacity: int, estimator: Estimator, whose: str
) -> str:
    """``whose`` names the config ("your config", "this config")."""
    from tuner.job.padding import BatchShape
    from tuner.memory.crash import crash_odds

    @cache
    def peak(batch: int, length: int) -> float:
        knobs = config.model_copy(update={"micro_batch_size": batch, "max_length": length})
        return float(estimator.predict(knobs).calibrated)

    def need(shape: BatchShape) -> float:
        return peak(shape.batch, shape.input_length)

    collation = data.collation(job.max_length, job.max_target_length)
    try:
        odds = crash_odds(data.lengths, config.micro_batch_size, world_size, collation, need, capacity)
    except TunerError as err:  # no traced point for the config's checkpointing/precision
        return f"{whose} on your data: no crash estimate ({err})"
    traced = sorted({p.max_length for p in estimator.trace.points})
    return (
        f"{whose} on your data: {odds.describe()} [the estimate traced inputs of {', '.join(map(str, traced))} "
        f"tokens, labels at {job.max_target_length or job.max_length}; other input lengths follow its a*L + b*L^2 "
        "fit, extrapolated beyond the traced ones]"
    )
