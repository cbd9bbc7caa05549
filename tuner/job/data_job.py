"""The job's lengths when the user gives their data: where each length comes from, what it truncates, and the lines
the dry run and a search's header print about the data. Pure: no torch, no `datasets`.

Precedence, later wins (as tuner.job.definition.resolve_job): a built-in preset's default, the data's longest sample
(their args truncate nothing), their training args' length, the flag. A length from the args or a flag truncates the
data there, and the job line says how much ("truncates 0.3% of samples, 0.1% of tokens (inputs at 512)").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.job.definition import HF_MAX_LENGTH_KEYS, JobFlags
from tuner.job.lengths import Quantiles, SampleLengths, Truncation
from tuner.job.padding import Collation, Padding, worst_is_padded

if TYPE_CHECKING:
    from tuner.job.length_summary import DataOrigin, LengthSummary

_TARGET_KEYS = ("max_target_length", "val_max_target_length")


@dataclass(frozen=True)
class DataJob:
    """The user's data as the job sees it: the train split's lengths (and the eval split's), how they were read."""

    lengths: SampleLengths
    described: str  # DataLengths.describe(): the samples, split, source and tokenizer
    padding: Padding = "longest"
    eval_lengths: SampleLengths | None = None
    eval_described: str | None = None
    origin: DataOrigin | None = None  # where the lengths came from, as the study stores it (None: not said)
    rounded: bool = False  # the lengths are a stored summary's, rounded up: the truncation line is an upper bound

    def summary(self) -> LengthSummary:
        """The lengths as the study stores them (tuner.job.length_summary: bounded, rounded up when it must)."""
        from tuner.job.length_summary import DataOrigin, LengthSummary

        return LengthSummary.of(self.lengths, self.origin or DataOrigin(self.described), self.padding)

    def defaults(self) -> JobFlags:
        """The lengths the data gives a job that truncates nothing: its longest input and, for seq2seq, target."""
        longest_target = int(self.lengths.target.max()) if self.lengths.target is not None else None
        return JobFlags(max_length=int(self.lengths.input.max()), max_target_length=longest_target)

    @property
    def pads(self) -> bool:
        """Whether the collator pads its batches, by the worst batch's rule (tuner.job.padding.worst_is_padded) at a
        shared batch: the samples differ in length, or it pads to max_length. The memory trace then runs padded
        batches, as the probes run the worst batch (at micro batch 1 padding to the longest pads nothing: a small
        overcount there)."""
        longest = int(self.lengths.input.max())
        return self.padding == "max_length" or worst_is_padded(self.lengths, 2, longest)

    def collation(self, max_length: int | None, max_target_length: int | None) -> Collation:
        return Collation(self.padding, max_length, max_target_length)

    def lines(self, max_length: int, max_target_length: int | None, sources: Mapping[str, str]) -> list[str]:
        """What the dry run and a search's header say about the data and the job's lengths."""
        out = [f"data: {self.described}", _quantiles("inputs", self.lengths.input)]
        if self.lengths.target is not None:
            out.append(_quantiles("targets", self.lengths.target))
        if self.eval_lengths is not None:
            out.append(f"eval data: {self.eval_described}")
        labels = ""
        if self.lengths.target is not None:
            labels = f", labels {max_target_length or max_length:,} ({sources.get('max_target_length', 'data')})"
        out.append(f"lengths: inputs {max_length:,} ({sources.get('max_length', 'data')}){labels}")
        cut = Truncation.of(self.lengths, max_length, max_target_length or max_length)
        bound = " (at most: the stored lengths are rounded up)" if self.rounded else ""
        out.append(f"truncation: {cut.describe()}{bound}; padding: {self.padding} (as your collator pads)")
        return out


def _quantiles(name: str, values: Any) -> str:
    q = Quantiles.of(values)
    return (
        f"  {name}: p50 {q.p50:,}, p90 {q.p90:,}, p99 {q.p99:,}, p99.9 {q.p999:,}, max {q.max:,} tokens "
        f"({q.count:,} samples)"
    )


def fill_from_data(flags: JobFlags, data: DataJob, hf_args: Mapping[str, Any] | None) -> JobFlags:
    """``flags`` with each length neither the flags nor the training args give taken from the data's longest."""
    found = data.defaults()
    args = hf_args or {}
    values = {}
    for name, keys in (("max_length", HF_MAX_LENGTH_KEYS), ("max_target_length", _TARGET_KEYS)):
        if getattr(flags, name) is None and not any(args.get(k) is not None for k in keys):
            values[name] = getattr(found, name)
    return dataclasses.replace(flags, **values)


def length_sources(flags: JobFlags, hf_args: Mapping[str, Any] | None, data: bool, builtin: bool) -> dict[str, str]:
    """Where each of the job's lengths comes from: 'flag', 'args', 'data' (the longest sample), 'preset default'."""

    def source(flag: int | None, keys: tuple[str, ...], default: str) -> str:
        if flag is not None:
            return "flag"
        if hf_args and any(hf_args.get(k) is not None for k in keys):
            return "args: " + next(k for k in keys if hf_args.get(k) is not None)
        return "data's longest sample" if data else default

    return {
        "max_length": source(flags.max_length, HF_MAX_LENGTH_KEYS, "preset default" if builtin else "unknown"),
        "max_target_length": source(flags.max_target_length, _TARGET_KEYS, "the input length"),
    }


def stored_data_job(summary: LengthSummary) -> DataJob:
    """A stored summary as the data a search probes on when the run reads no dataset (a resumed study, one created
    by ``POST /studies``): each cell's lengths repeated by its count, so the worst batch is the data's or longer
    (rounded up, never down: conservative), and the batches drawn from it are of samples as long or a little longer
    (seed-shaped data at 6 bits: +0.2% to +7% padded tokens per batch, so throughput is read a little low)."""
    if summary.rounding.exact:
        stored = "lengths stored exactly"
    else:
        stored = (
            f"lengths rounded up ({summary.rounding.raised()}): the probes' worst batch is the data's or longer "
            "(conservative), the drawn batches' samples as long or a little longer"
        )
    described = f"{summary.origin.describe(summary.samples)}; from the study's stored summary (no --dataset): {stored}"
    return DataJob(
        summary.expand(), described, summary.padding, origin=summary.origin, rounded=not summary.rounding.exact
    )
