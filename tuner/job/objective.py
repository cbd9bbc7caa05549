"""What the search maximises: throughput at the fixed global batch.

With one max_length, samples/s. When max_length varies, retained tokens/s = samples/s x mean(min(len, max_length))
over the user's length distribution (``--lengths FILE``), or samples/s x max_length with no dataset, so a shorter
max_length that truncates the data away never wins by processing fewer tokens. Pure, no torch.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Literal, cast, get_args

from trials.contract import ProbeResult
from tuner.bounded import MAX_LENGTHS_BYTES, read_text_file
from tuner.errors import ConfigError

Kind = Literal["samples_per_s", "retained_tokens_per_s"]


@dataclass(frozen=True)
class Objective:
    kind: Kind = "samples_per_s"
    lengths: tuple[int, ...] = ()  # sorted sample lengths in tokens; empty = no dataset given
    _prefix: tuple[int, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.lengths and not self._prefix:
            ordered = tuple(sorted(self.lengths))
            object.__setattr__(self, "lengths", ordered)
            object.__setattr__(self, "_prefix", tuple(accumulate(ordered)))

    @property
    def unit(self) -> str:
        return "samples/s" if self.kind == "samples_per_s" else "retained tokens/s"

    def retained_tokens(self, max_length: int) -> float:
        """Mean tokens a sample keeps when truncated to ``max_length`` (max_length itself without a dataset)."""
        if not self.lengths:
            return float(max_length)
        cut = bisect.bisect_right(self.lengths, max_length)  # lengths[:cut] are kept whole
        kept = (self._prefix[cut - 1] if cut else 0) + (len(self.lengths) - cut) * max_length
        return kept / len(self.lengths)

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
        return {"kind": self.kind, "lengths": list(self.lengths)}

    @classmethod
    def from_dict(cls, data: dict[str, object] | None) -> Objective:
        if not data:
            return cls()
        kind = data.get("kind", "samples_per_s")
        if kind not in get_args(Kind):
            raise ConfigError(f"stored objective kind {kind!r} is unknown; expected one of {', '.join(get_args(Kind))}")
        lengths = data.get("lengths") or ()
        return cls(kind=cast(Kind, kind), lengths=tuple(int(n) for n in cast(Iterable[int], lengths)))


def objective_for(max_length_choices: Sequence[int], lengths: Sequence[int] | None = None) -> Objective:
    """samples/s for one max_length; retained tokens/s when the space varies it."""
    if len(set(max_length_choices)) > 1:
        return Objective(kind="retained_tokens_per_s", lengths=tuple(lengths or ()))
    return Objective(kind="samples_per_s")


def load_lengths(path: str | Path) -> list[int]:
    """Sample lengths in tokens: a JSON list, or integers separated by whitespace, commas or newlines."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"lengths file {p} does not exist; give a file of token counts, one per line")
    text = read_text_file(p, "lengths file", MAX_LENGTHS_BYTES).strip()
    try:
        values = json.loads(text) if text.startswith("[") else text.replace(",", " ").split()
        lengths = [int(v) for v in values]  # a list of numbers, one level: nothing nested passes int()
    except (ValueError, TypeError, RecursionError):
        raise ConfigError(f"lengths file {p} must hold integer token counts (one per line, or a JSON list)") from None
    if not lengths or min(lengths) < 0:
        raise ConfigError(f"lengths file {p} must hold at least one non-negative token count")
    return lengths
