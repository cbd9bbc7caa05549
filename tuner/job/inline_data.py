"""The user's data as per-sample token lengths given inline (the body of ``POST /studies``): what `tuner search
--dataset` reads from their files, posted instead, because the server reads no path of a caller's choosing. The
lengths are the ones `tuner lengths --dataset ... -o FILE` writes (input and target per sample, or inputs only for a
causal LM); a large dataset is posted as a seeded sample of it (`tuner lengths --max-samples N`). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, StrictInt

from tuner.errors import ConfigError
from tuner.job.padding import Padding

if TYPE_CHECKING:
    from tuner.job.data_job import DataJob

MAX_INLINE_SAMPLES = 10_000  # ~100 KiB of JSON pairs: under the API's body limit (api.guard.MAX_BODY_BYTES)
MAX_TOKENS = 1 << 20  # a sample's length in tokens: above any model's context; larger is a typo
Tokens = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]  # strict: true is no length
#: what the API body takes: [input, target] pairs (seq2seq) or input lengths (causal LM)
InlineLengths = list[tuple[Tokens, Tokens]] | list[Tokens]


def inline_data(lengths: Sequence[Sequence[int]] | Sequence[int], padding: Padding = "longest") -> DataJob:
    """The data job of posted lengths: pairs are seq2seq (input, target); plain integers are a causal LM's inputs."""
    from tuner.job.data_job import DataJob
    from tuner.job.lengths import SampleLengths

    if not lengths:
        raise ConfigError("sample_lengths is empty: give your samples' token lengths (tuner lengths -o FILE)")
    if all(isinstance(n, int) for n in lengths):
        sample = SampleLengths.of([int(n) for n in lengths])  # type: ignore[arg-type]
    elif all(isinstance(n, Sequence) and len(n) == 2 for n in lengths):
        pairs = [(int(i), int(t)) for i, t in lengths]  # type: ignore[misc]
        sample = SampleLengths.of([i for i, _ in pairs], [t for _, t in pairs])
    else:
        raise ConfigError("sample_lengths: give [input, target] pairs (seq2seq) or input lengths (causal LM), not both")
    for side, values in (("input", sample.input), ("target", sample.target)):
        if values is not None and int(values.max()) < 1:
            raise ConfigError(f"sample_lengths: every {side} length is 0 tokens; give your samples' token lengths")
    from tuner.job.length_summary import DataOrigin

    origin = DataOrigin("sample_lengths posted inline", total=len(sample))
    return DataJob(sample, f"{len(sample):,} samples' lengths posted inline", padding, origin=origin)
