"""What the search maximises: throughput at the fixed global batch.

With the user's data (``--dataset``) the probes time batches drawn from it under their collator's padding
(tuner.probing.batches), so samples/s is on the data's distribution ("on drawn batches"); without it, on batches
padded to max_length.

With one max_length, samples/s. When max_length varies, retained tokens/s = samples/s x mean(min(len, max_length))
over the user's length distribution (``--lengths FILE``, its input column), or samples/s x max_length with no
dataset, so a shorter max_length that truncates the data away never wins by processing fewer tokens. Pure, no torch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Literal, cast, get_args

from trials.contract import ProbeResult
from tuner.errors import ConfigError
from tuner.job.lengths import read_lengths_file

Kind = Literal["samples_per_s", "retained_tokens_per_s"]
Batches = Literal["fixed", "drawn"]


@dataclass(frozen=True)
class Objective:
    kind: Kind = "samples_per_s"
    lengths: tuple[int, ...] = ()  # sorted sample lengths in tokens; empty = no dataset given
    # what the probes time: "fixed" (every batch padded to max_length), "drawn" (--dataset: batches drawn from the
    # data under the collator's padding, so samples/s is what their run would see)
    batches: Batches = "fixed"
    _prefix: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.lengths and not self._prefix:
            ordered = tuple(sorted(self.lengths))
            object.__setattr__(self, "lengths", ordered)
            object.__setattr__(self, "_prefix", tuple(accumulate(ordered)))

    @property
    def unit(self) -> str:
        unit = "samples/s" if self.kind == "samples_per_s" else "retained tokens/s"
        return unit + (" on drawn batches" if self.batches == "drawn" else "")

    def retained_tokens(self, max_length: int) -> float:
        """Mean tokens a sample keeps when truncated to ``max_length`` (max_length itself without a dataset)."""
        if not self.lengths:
            return float(max_length)
        cut = bisect.bisect_right(self.lengths, max_length)  # lengths[:cut] are kept whole
        kept = (self._prefix[cut - 1] if cut else 0) + (len(self.lengths) - cut) * max_length
        return kept / len(self.lengths)

    def truncation(self, max_length: int) -> str | None:
        """What truncating at ``max_length`` cuts from the lengths this objective counts, in words ("truncates 2.1%
        of samples, 0.9% of tokens (inputs at 64)" or "truncates nothing"); None when it counts no lengths."""
        if not self.lengths:
            return None
        from tuner.job.lengths import SampleLengths, Truncation

        return Truncation.of(SampleLengths.of(self.lengths), max_length).describe()

    def value(self, samples_per_s: float | None, max_length: int) -> float | None:
        if samples_per_s is None:
            return None
        if self.kind == "samples_per_s":
            return float(samples_per_s)
        return float(samples_per_s) * self.retained_tokens(max_length)

    def of(self, result: ProbeResult, max_length: int) -> float | None:
        if result.status != "ok":
            return None
        return self.value(result.samples_per_s, max_length)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind, "lengths": list(self.lengths)}
        if self.batches != "fixed":  # a fixed-shape study's stored objective stays as it was
            out["batches"] = self.batches
        return out

    @classmethod
    def from_dict(cls, data: dict[str, object] | None) -> Objective:
        if not data:
            return cls()
        kind = data.get("kind", "samples_per_s")
        if kind not in get_args(Kind):
            raise ConfigError(f"stored objective kind {kind!r} is unknown; expected one of {', '.join(get_args(Kind))}")
        lengths = data.get("lengths") or ()
        batches = data.get("batches", "fixed")
        if batches not in get_args(Batches):
            raise ConfigError(f"stored objective batches {batches!r} is unknown; expected one of fixed, drawn")
        return cls(
            kind=cast(Kind, kind),
            lengths=tuple(int(n) for n in cast(Iterable[int], lengths)),
            batches=cast(Batches, batches),
        )


def objective_for(
    max_length_choices: Sequence[int], lengths: Sequence[int] | None = None, *, drawn: bool = False
) -> Objective:
    """samples/s for one max_length; retained tokens/s when the space varies it. ``drawn``: the probes time batches
    drawn from the user's data (--dataset), so the throughput is on the data's distribution."""
    batches: Batches = "drawn" if drawn else "fixed"
    if len(set(max_length_choices)) > 1:
        return Objective(kind="retained_tokens_per_s", lengths=tuple(lengths or ()), batches=batches)
    return Objective(kind="samples_per_s", batches=batches)


def load_lengths(path: str | Path) -> list[int]:
    """The input lengths of a lengths file: ``input<TAB>target`` per line (``tuner lengths -o``), or the one-column
    form (a JSON list, or integers separated by whitespace, commas or newlines). The objective truncates inputs."""
    return [int(n) for n in read_lengths_file(path).input.tolist()]
