"""The token lengths of the user's samples: their distribution, what a truncation cuts, and the lengths file.

``SampleLengths`` holds one input length per sample and, for seq2seq, one target (label) length; a causal LM has
inputs only. Quantiles are nearest-rank (always a length some sample has). A *cut* at ``n`` tokens is the share of
samples longer than ``n`` and the share of all tokens past ``n``: what truncating at ``n`` would throw away.

The lengths file (``tuner lengths -o``, read by ``--lengths``): one sample per line, ``input<TAB>target``; lines
starting with ``#`` are comments. The older one-column form (integers separated by whitespace, commas or newlines,
or a JSON list) still reads, as inputs only. Pure: numpy, no torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tuner.bounded import MAX_LENGTHS_BYTES, read_text_file
from tuner.errors import ConfigError

IntArray = npt.NDArray[np.int64]
QUANTILES = (0.5, 0.9, 0.99, 0.999)
_TSV_HEADER = "# input\ttarget"


def _ints(values: Sequence[int] | npt.ArrayLike) -> IntArray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


@dataclass(frozen=True, eq=False)
class SampleLengths:
    """Per-sample token lengths, in dataset order. ``target`` is None for a causal LM (inputs only)."""

    input: IntArray
    target: IntArray | None = None

    @classmethod
    def of(
        cls, inputs: Sequence[int] | npt.ArrayLike, targets: Sequence[int] | npt.ArrayLike | None = None
    ) -> SampleLengths:
        i = _ints(inputs)
        t = None if targets is None else _ints(targets)
        if t is not None and len(t) != len(i):
            raise ConfigError(f"{len(i)} input lengths but {len(t)} target lengths; give one of each per sample")
        if any(len(side) and int(side.min()) < 0 for side in (i, t) if side is not None):
            raise ConfigError("token lengths must be non-negative")
        return cls(input=i, target=t)

    def __len__(self) -> int:
        return len(self.input)

    @property
    def seq2seq(self) -> bool:
        return self.target is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SampleLengths):
            return NotImplemented
        same_target = (self.target is None) == (other.target is None) and (
            self.target is None or np.array_equal(self.target, other.target)  # type: ignore[arg-type]
        )
        return bool(np.array_equal(self.input, other.input)) and same_target

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Quantiles:
    count: int
    p50: int
    p90: int
    p99: int
    p999: int
    max: int
    mean: float

    @classmethod
    def of(cls, lengths: IntArray) -> Quantiles:
        if not len(lengths):
            raise ConfigError("no samples: the dataset is empty")
        ordered = np.sort(lengths)
        n = len(ordered)
        p50, p90, p99, p999 = (int(ordered[max(int(np.ceil(q * n)) - 1, 0)]) for q in QUANTILES)
        return cls(n, p50, p90, p99, p999, int(ordered[-1]), float(ordered.mean()))


@dataclass(frozen=True)
class Cut:
    """Truncating at ``at`` tokens: the share of samples longer, and the share of all tokens past it."""

    at: int
    samples: float
    tokens: float


def cut(lengths: IntArray, at: int) -> Cut:
    if at < 0:
        raise ConfigError(f"a cut at {at} tokens is not a length; give a positive number of tokens")
    total = int(lengths.sum())
    over = lengths > at
    lost = int((lengths[over] - at).sum())
    return Cut(at, float(over.mean()) if len(lengths) else 0.0, lost / total if total else 0.0)


def cut_points(lengths: IntArray, most: int = 5) -> list[int]:
    """A few round lengths worth showing: the powers of two from the median up to (not including) the longest."""
    if not len(lengths):
        return []
    q = Quantiles.of(lengths)
    points: list[int] = []
    p = 1 << max(int(q.p50).bit_length() - 1, 0)
    while p < q.max:
        if p >= q.p50:
            points.append(p)
        p *= 2
    return points[-most:]


@dataclass(frozen=True)
class Truncation:
    """What a job's length limits cut from the data (None limit: that side is not truncated)."""

    max_length: int | None
    max_target_length: int | None
    input: Cut | None
    target: Cut | None

    @classmethod
    def of(cls, lengths: SampleLengths, max_length: int | None, max_target_length: int | None = None) -> Truncation:
        i = cut(lengths.input, max_length) if max_length is not None else None
        t = (
            cut(lengths.target, max_target_length)
            if max_target_length is not None and lengths.target is not None
            else None
        )
        return cls(max_length, max_target_length, i, t)

    @property
    def cuts_anything(self) -> bool:
        return any(c is not None and c.samples > 0 for c in (self.input, self.target))

    def describe(self) -> str:
        """'truncates nothing' or 'truncates 0.3% of samples, 0.1% of tokens (inputs at 512); ...'."""
        parts = []
        for side, c in (("inputs", self.input), ("targets", self.target)):
            if c is not None and c.samples > 0:
                parts.append(f"truncates {_pct(c.samples)} of samples, {_pct(c.tokens)} of tokens ({side} at {c.at})")
        return "; ".join(parts) if parts else "truncates nothing"


def _pct(share: float) -> str:
    if share == 0:
        return "0%"
    if share < 0.001:
        return "<0.1%"
    return f"{share * 100:.1f}%"


def histogram(lengths: IntArray, width: int = 40) -> list[str]:
    """A compact text histogram over power-of-two bins ('   513-1024 ████▌ 1,234'), one line per non-empty bin."""
    if not len(lengths):
        return []
    top = int(lengths.max())
    edges = [0]
    while edges[-1] < top:
        edges.append(max(1, edges[-1] * 2))
    counts = np.histogram(lengths, bins=np.array(edges, dtype=np.float64) + 0.5)[0] if len(edges) > 1 else np.array([])
    zero = int((lengths == 0).sum())
    rows: list[tuple[str, int]] = [("0", zero)] if zero else []
    rows += [(_bin_label(edges[k] + 1, edges[k + 1]), int(c)) for k, c in enumerate(counts)]
    biggest = max((c for _, c in rows), default=1) or 1
    label_width = max(len(label) for label, _ in rows)
    out = []
    for label, c in rows:
        if not c:
            continue
        eighths = max(1, round(width * 8 * c / biggest))
        bar = "█" * (eighths // 8) + (" ▏▎▍▌▋▊▉"[eighths % 8] if eighths % 8 else "")
        out.append(f"{label:>{label_width}} {bar:<{width + 1}} {c:,}")
    return out


def _bin_label(lo: int, hi: int) -> str:
    return str(hi) if lo == hi else f"{lo}-{hi}"


def write_tsv(lengths: SampleLengths, path: str | Path) -> None:
    """One sample per line: ``input<TAB>target`` (seq2seq) or ``input`` (causal LM), after a ``#`` header."""
    if lengths.target is None:
        text = "# input\n" + "".join(f"{n}\n" for n in lengths.input.tolist())
    else:
        rows = zip(lengths.input.tolist(), lengths.target.tolist(), strict=True)
        text = _TSV_HEADER + "\n" + "".join(f"{i}\t{t}\n" for i, t in rows)
    Path(path).write_text(text)


def read_lengths_file(path: str | Path) -> SampleLengths:
    """The two-column ``input<TAB>target`` form, or the one-column form (inputs only); one line names the fix."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"lengths file {p} does not exist; give a file of token counts (`tuner lengths -o FILE`)")
    text = read_text_file(p, "lengths file", MAX_LENGTHS_BYTES)  # a regular file, bounded
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    two_columns = bool(lines) and "\t" in lines[0].strip()
    try:
        if two_columns:
            pairs = [ln.split() for ln in lines]
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError
            lengths = SampleLengths.of([int(a) for a, _ in pairs], [int(b) for _, b in pairs])
        else:
            text = "\n".join(lines)
            values = json.loads(text) if text.startswith("[") else text.replace(",", " ").split()
            lengths = SampleLengths.of([int(v) for v in values])
    except (ValueError, TypeError, RecursionError):
        raise ConfigError(
            f"lengths file {p} must hold integer token counts: 'input<TAB>target' per line, or one count per line"
        ) from None
    except ConfigError as err:
        raise ConfigError(f"lengths file {p}: {err}") from None
    if not len(lengths):
        raise ConfigError(f"lengths file {p} must hold at least one token count")
    return lengths
