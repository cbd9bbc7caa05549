"""The user's data as a study stores it: a bounded summary of the (input, target) token lengths, with where it came
from, so that `tuner trials`, `tuner best --changes` and the report can say when a config would crash
(tuner.memory.crash) without the dataset. Pure: numpy, no torch, no `datasets`.

The summary is a joint histogram: cells of (input length, target length, count). When the data's distinct (input,
target) pairs fit in ``MAX_CELLS`` cells the summary is exact. Otherwise lengths are rounded UP, never down:

- each input length to ``bits`` significant bits (below 2**bits exact; above, up to the next multiple of a power of
  two, so by less than 2**(1 - bits) of itself: 3.1% at 6 bits), the most bits that leave every rounded input at least
  ``MIN_GROUPS`` target cells;
- within each rounded input, the targets in at most ``groups`` equal-count groups, each sample's target raised to
  the longest of its group (exact when the input has that few distinct targets).

Every sample's summarised (input, target) is then at least its own, and a batch's need grows with both, so every
batch needs at least what it needs with the exact lengths: the share of batches that do not fit is over-, never
under-stated, and the worst batch is the same or longer (conservative). ``Rounding`` keeps how far lengths were
raised (the most tokens, measured), and the crash line says it.

The stored JSON (``to_json``): ``rows`` with one row per rounded input: ``[input, target, count, target, count ...]``
(seq2seq) or ``[input, count]`` (causal LM). A 100,000-sample seed-shaped set stays under 6 KiB.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from tuner.errors import ConfigError
from tuner.job.lengths import IntArray, SampleLengths
from tuner.job.padding import PADDINGS, Padding

VERSION = 1
MAX_CELLS = 512  # ~5 KiB of JSON
MIN_GROUPS = 4  # target cells per rounded input worth keeping before inputs lose another bit
MAX_STORED_SAMPLES = 1 << 31  # a stored summary counting more is not one tuner wrote


class SummaryError(ConfigError):
    """A stored summary that is not one: its one line names the study's definition field."""


@dataclass(frozen=True)
class DataOrigin:
    """Where the summarised lengths came from (what the crash line and `tuner trials` name)."""

    source: str  # the dataset as given (a local path resolved), or "sample_lengths posted inline"
    split: str | None = None
    input_column: str | None = None
    target_column: str | None = None
    text_column: str | None = None
    tokenizer: str | None = None
    total: int | None = None  # samples in the split (more than the summary's when --max-samples scanned fewer)
    max_samples: int | None = None  # --max-samples as given (None: the whole split)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> DataOrigin:
        if not isinstance(stored, Mapping) or not isinstance(stored.get("source"), str):
            raise SummaryError("the study's data origin has no source; the stored definition is not tuner's")
        known: dict[str, Any] = {k: stored.get(k) for k in cls.__dataclass_fields__}
        for name in ("total", "max_samples"):
            value = known[name]
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise SummaryError(f"the study's data origin: {name} {value!r} is not a number of samples")
        return cls(**known)

    @classmethod
    def of_dataset(
        cls,
        path: str,
        split: str,
        columns: tuple[str | None, str | None, str | None],
        tokenizer: str,
        total: int,
        max_samples: int | None,
    ) -> DataOrigin:
        """A dataset read on this host: a local path absolute (a resumed study compares it), a hub name as given."""
        local = Path(path).expanduser()
        source = str(local.resolve()) if local.exists() else path
        tok = Path(tokenizer).expanduser()
        tokenizer = str(tok.resolve()) if tok.exists() else tokenizer
        return cls(source, split, *columns, tokenizer=tokenizer, total=total, max_samples=max_samples)

    def describe(self, samples: int) -> str:
        where = self.source + (f" [{self.split}]" if self.split else "")
        if self.total is not None and self.total > samples:
            what = f"a seeded random {samples:,} of {self.total:,} samples (--max-samples)"
        else:
            what = f"{samples:,} samples"
        tok = f", tokenized with {self.tokenizer}" if self.tokenizer else ""
        return f"{what} of {where}{tok}"


@dataclass(frozen=True)
class Rounding:
    """How far the summary raised lengths: ``bits`` significant bits of inputs (None: exact), at most ``groups``
    target cells per input (None: exact), and the most tokens any input / target was raised by (measured)."""

    bits: int | None = None
    groups: int | None = None
    input_tokens: int = 0
    target_tokens: int = 0

    @property
    def exact(self) -> bool:
        return self.input_tokens == 0 and self.target_tokens == 0

    def raised(self) -> str:
        """How far lengths were raised: "inputs by at most 12 tokens (6 significant bits), targets by ..."."""
        parts = []
        if self.input_tokens:
            parts.append(f"inputs by at most {self.input_tokens:,} tokens ({self.bits} significant bits)")
        if self.target_tokens:
            parts.append(f"targets by at most {self.target_tokens:,} tokens ({self.groups} groups per input)")
        return ", ".join(parts)

    def describe(self) -> str:
        if self.exact:
            return "lengths stored exactly"
        return "lengths rounded up (conservative: the share is over-, never under-stated): " + self.raised()

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Rounding:
        if not isinstance(stored, Mapping):
            raise SummaryError("the study's data rounding is not an object; the stored definition is not tuner's")
        values = {k: stored.get(k, f.default) for k, f in cls.__dataclass_fields__.items()}
        for name, value in values.items():
            optional = name in ("bits", "groups")
            if (value is None and optional) or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                continue
            raise SummaryError(f"the study's data rounding: {name} {value!r} is not a count")
        return cls(**values)


def round_up(values: IntArray, bits: int | None) -> IntArray:
    """Each value with at most ``bits`` significant bits, rounded up (None: unchanged)."""
    if bits is None:
        return values
    length = np.frexp(values.astype(np.float64))[1].astype(np.int64)  # bit_length, exact below 2**53
    step = np.left_shift(np.int64(1), np.maximum(length - bits, 0))
    return np.asarray(-(-values // step) * step, dtype=np.int64)


def _pairs(inputs: IntArray, targets: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """The distinct (input, target) pairs, sorted, with their counts."""
    shift = max(int(targets.max()).bit_length(), 1) if len(targets) else 1
    keys, counts = np.unique((inputs << shift) | targets, return_counts=True)  # one integer key per pair: fast
    return keys >> shift, keys & ((1 << shift) - 1), counts.astype(np.int64)


def _grouped(inputs: IntArray, targets: IntArray, counts: IntArray, groups: int | None) -> list[list[int]]:
    """Rows ``[input, target, count ...]``: per input, its targets in at most ``groups`` equal-count groups, each
    raised to its group's longest (``inputs`` sorted, the pairs distinct)."""
    rows: list[list[int]] = []
    starts = np.flatnonzero(np.r_[True, inputs[1:] != inputs[:-1]])
    for start, end in zip(starts.tolist(), [*starts[1:].tolist(), len(inputs)], strict=True):
        t, c = targets[start:end].tolist(), counts[start:end].tolist()
        row = [int(inputs[start])]
        if groups is None or len(t) <= groups:
            for tv, cv in zip(t, c, strict=True):
                row += [tv, cv]
        else:
            total, acc, held, g = sum(c), 0, 0, 1
            for k, (tv, cv) in enumerate(zip(t, c, strict=True)):
                acc += cv
                held += cv
                if acc * groups >= g * total or k == len(t) - 1:  # the group's end: its longest target
                    row += [tv, held]
                    held = 0
                    while acc * groups >= g * total:
                        g += 1
        rows.append(row)
    return rows


def _choose(inputs: IntArray, targets: IntArray | None, max_cells: int) -> tuple[int | None, int | None]:
    """The (bits, groups) that keep the most precision in ``max_cells`` cells: exact when it fits; else the most
    input bits that leave MIN_GROUPS target cells per input, then the most target groups."""
    top = int(inputs.max()).bit_length()
    if targets is None:
        for bits in (None, *range(top - 1, 0, -1)):
            if len(np.unique(round_up(inputs, bits))) <= max_cells:
                return bits, None
        return 1, None
    for bits in (None, *range(top - 1, 0, -1)):
        rounded, _, _ = _pairs(round_up(inputs, bits), targets)
        per_input = np.unique(rounded, return_counts=True)[1]
        if int(per_input.sum()) <= max_cells:
            return bits, None
        if int(np.minimum(per_input, MIN_GROUPS).sum()) <= max_cells:
            groups = MIN_GROUPS
            while int(np.minimum(per_input, groups + 1).sum()) <= max_cells:
                groups += 1
            return bits, groups
    return 1, 1


@dataclass(frozen=True, eq=False)
class LengthSummary:
    """The summarised lengths: ``rows`` as stored (see the module's note), how they were rounded, where they came
    from, and the collator's padding (the crash calculation needs it)."""

    seq2seq: bool
    rows: tuple[tuple[int, ...], ...]
    rounding: Rounding
    origin: DataOrigin
    padding: Padding = "longest"
    _cells: tuple[IntArray, IntArray | None, IntArray] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(
        cls, lengths: SampleLengths, origin: DataOrigin, padding: Padding = "longest", max_cells: int = MAX_CELLS
    ) -> LengthSummary:
        if not len(lengths):
            raise ConfigError("no samples: the dataset is empty")
        if max_cells < 1:
            raise ConfigError(f"a summary of {max_cells} cells holds nothing; give 1 or more")
        bits, groups = _choose(lengths.input, lengths.target, max_cells)
        inputs = round_up(lengths.input, bits)
        raised_in = int((inputs - lengths.input).max())
        if lengths.target is None:
            values, counts = np.unique(inputs, return_counts=True)
            rows = [[int(v), int(c)] for v, c in zip(values.tolist(), counts.tolist(), strict=True)]
            return cls(False, _frozen(rows), Rounding(bits, None, raised_in, 0), origin, padding)
        i, t, c = _pairs(inputs, lengths.target)
        rows = _grouped(i, t, c, groups)
        summary = cls(True, _frozen(rows), Rounding(bits, groups, raised_in, 0), origin, padding)
        return summary._with_target_raise(inputs, lengths.target)

    def _with_target_raise(self, inputs: IntArray, targets: IntArray) -> LengthSummary:
        """The same summary with the most tokens a target was raised by (per input, a sample's target to the
        smallest stored target at least as long)."""
        most = 0
        by_input = {row[0]: np.array(row[1::2], dtype=np.int64) for row in self.rows}
        order = np.argsort(inputs, kind="stable")
        ins, tgs = inputs[order], targets[order]
        starts = np.flatnonzero(np.r_[True, ins[1:] != ins[:-1]])
        for start, end in zip(starts.tolist(), [*starts[1:].tolist(), len(ins)], strict=True):
            mine = tgs[start:end]
            stored = by_input[int(ins[start])]
            raised = stored[np.searchsorted(stored, mine, side="left")] - mine
            most = max(most, int(raised.max()))
        r = self.rounding
        return LengthSummary(
            self.seq2seq, self.rows, Rounding(r.bits, r.groups, r.input_tokens, most), self.origin, self.padding
        )

    # -- what the crash calculation reads ----------------------------------------------------------------------------
    def cells(self) -> tuple[SampleLengths, IntArray]:
        """One length row per cell and how many samples it stands for (tuner.memory.crash's ``counts``)."""
        if self._cells is None:
            inp: list[int] = []
            tgt: list[int] = []
            cnt: list[int] = []
            for row in self.rows:
                if self.seq2seq:
                    pairs = list(zip(row[1::2], row[2::2], strict=True))
                    inp += [row[0]] * len(pairs)
                    tgt += [p[0] for p in pairs]
                    cnt += [p[1] for p in pairs]
                else:
                    inp.append(row[0])
                    cnt.append(row[1])
            cells = (np.array(inp, dtype=np.int64), np.array(tgt, dtype=np.int64) if self.seq2seq else None)
            object.__setattr__(self, "_cells", (*cells, np.array(cnt, dtype=np.int64)))
        assert self._cells is not None
        i, t, c = self._cells
        return SampleLengths(i, t), c

    def expand(self) -> SampleLengths:
        """One length per sample (each cell's lengths repeated by its count): the summary as SampleLengths."""
        lengths, counts = self.cells()
        t = None if lengths.target is None else np.repeat(lengths.target, counts)
        return SampleLengths(np.repeat(lengths.input, counts), t)

    @property
    def samples(self) -> int:
        return int(self.cells()[1].sum())

    @property
    def longest_input(self) -> int:
        return max(row[0] for row in self.rows)

    def describe(self) -> str:
        return f"{self.origin.describe(self.samples)}; {self.rounding.describe()}"

    # -- stored ------------------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "seq2seq": self.seq2seq,
            "padding": self.padding,
            "origin": self.origin.to_json(),
            "rounding": self.rounding.to_json(),
            "rows": [list(row) for row in self.rows],
        }

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> LengthSummary:
        """The stored summary; SummaryError (one line) when it is not one tuner wrote."""
        if not isinstance(stored, Mapping):
            raise SummaryError("the study's data is not an object; the stored definition is not tuner's")
        if stored.get("version") != VERSION:
            raise SummaryError(
                f"the study's data summary is version {stored.get('version')!r}; this tuner reads {VERSION}"
            )
        padding = stored.get("padding", "longest")
        if padding not in PADDINGS:
            raise SummaryError(f"the study's data padding {padding!r} is not one of {', '.join(PADDINGS)}")
        seq2seq = stored.get("seq2seq")
        rows = stored.get("rows")
        if not isinstance(seq2seq, bool) or not isinstance(rows, list) or not rows:
            raise SummaryError("the study's data summary has no rows; the stored definition is not tuner's")
        width_ok = (lambda n: n >= 3 and n % 2 == 1) if seq2seq else (lambda n: n == 2)
        total = 0
        for row in rows:
            ok = isinstance(row, list) and width_ok(len(row))
            ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row)
            ok = ok and all(c >= 1 for c in row[2::2] if seq2seq) and (seq2seq or row[1] >= 1)
            if not ok:
                raise SummaryError(f"the study's data summary row {str(row)[:40]} is not [input, target, count ...]")
            total += sum(row[2::2]) if seq2seq else row[1]
        if total > MAX_STORED_SAMPLES or len(rows) > 16 * MAX_CELLS:
            raise SummaryError(
                "the study's data summary is larger than tuner writes; the stored definition is not tuner's"
            )
        return cls(
            seq2seq,
            _frozen(rows),
            Rounding.from_json(stored.get("rounding") or {}),
            DataOrigin.from_json(stored.get("origin") or {}),
            cast(Padding, padding),
        )


def _frozen(rows: list[list[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(v) for v in row) for row in rows)


__all__ = ["MAX_CELLS", "DataOrigin", "LengthSummary", "Rounding", "SummaryError", "round_up"]
