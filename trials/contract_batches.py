"""The probe contract's batch shapes: the micro batch a rank builds (BatchDims), the batches a probe of a job with data
runs (DataBatches), and the accumulation a probe runs. Part of the contract (trials.contract re-exports it).

No torch import."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """The contract's base model: unknown fields are refused (both sides of the process boundary agree exactly)."""

    model_config = ConfigDict(extra="forbid")


class BatchDims(Strict):
    """One rank's micro batch as a probe builds it (``micro_batch_size`` rows): inputs padded to ``input_length``,
    seq2seq labels to ``target_length`` (None: a causal LM, whose labels are its inputs), the tokens its samples
    really hold, inputs only, padding excluded (None where not counted: a worst batch), and whether any row is
    padded (its attention mask then marks the padding, as the user's collator does)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_length: int = Field(ge=1)
    target_length: int | None = Field(None, ge=1)
    real_tokens: int | None = Field(None, ge=0)
    # a row shorter than input_length is padded by the collator, so its attention mask holds zeros: a causal LM then
    # builds its [batch, 1, len, len] mask (an all-ones mask lets transformers skip it for SDPA's is_causal)
    padded: bool = False


class DataBatches(Strict):
    """The batches a probe of a job with data runs (tuner.probing.batches draws them from the user's lengths under
    their collator's padding): the memory window at ``worst`` on every rank (each rank's worst case is its own batch
    of the longest samples), the eval forward / generate at ``eval_worst`` (the eval set's worst batch), and the timed
    steps on ``timed[rank][step]``: each rank its own micro batch drawn from seeded shuffled epochs, as their
    DistributedSampler draws (a probe with more timed steps than drawn cycles through them)."""

    worst: BatchDims
    eval_worst: BatchDims | None = None
    timed: list[list[BatchDims]] = Field(min_length=1)
    seed: int = 0
    padding: str = "longest"

    def timed_for(self, rank: int) -> list[BatchDims]:
        return self.timed[rank % len(self.timed)]


def probe_accum(gradient_accumulation_steps: int) -> int:
    """The accumulation a probe runs (the runner composes the real cycle from its plain and boundary steps)."""
    return min(gradient_accumulation_steps, 2)


def timed_micro_steps(measure_steps: int, gradient_accumulation_steps: int) -> int:
    """How many micro-steps a probe's timed window runs: whole accumulation cycles covering ``measure_steps``."""
    accum = probe_accum(gradient_accumulation_steps)
    return math.ceil(max(measure_steps, accum) / accum) * accum
