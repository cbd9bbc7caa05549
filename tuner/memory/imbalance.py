"""Per-rank memory imbalance: pure functions over a probe's per-rank peaks (no torch, no I/O).

In data-parallel training every rank holds the same model state and, with worst-case padded batches, the same
activations; peaks that differ by more than ``THRESHOLD`` between ranks point at something in the setup rather than
the knobs, and the rank that stands out tells which:

- the heaviest rank is rank 0: rank-0 gathering (metrics, eval predictions, ``generate`` outputs, a full state dict
  for saving collected on rank 0) or ``torch.nn.DataParallel`` instead of a launcher (it replicates the model from
  cuda:0 and gathers every output there);
- another rank is the heaviest: uneven data (a sampler without ``drop_last``, dynamic padding that gives one rank the
  longest sequences, a shard with more samples).

The spread is ``max / min - 1`` over the ranks' peak allocated bytes: 0.25 means the heaviest rank needs 25% more
than the lightest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.records.measurement import Measurement

THRESHOLD = 0.20

CAUSE_RANK0_GATHER = (
    "rank-0 gathering: metrics, eval predictions, generate() outputs or a full state dict collected on rank 0 "
    "(gather to CPU, or use DeepSpeed's stage3_gather_16bit_weights_on_model_save=false)"
)
CAUSE_DATAPARALLEL = (
    "torch.nn.DataParallel instead of a launcher: it replicates the model from cuda:0 and gathers outputs there "
    "(run one process per GPU with torchrun, accelerate launch or the deepspeed launcher)"
)
CAUSE_UNEVEN_DATA = (
    "uneven data: some rank gets longer sequences or more samples (pad to max_length or bucket by length, "
    "use a DistributedSampler with drop_last=True)"
)


@dataclass(frozen=True)
class Imbalance:
    """Per-rank peaks of one multi-rank probe and whether their spread is flagged."""

    peaks: dict[int, int]  # rank -> peak allocated bytes
    spread: float  # max / min - 1 (inf when a rank reports 0 bytes while another does not)
    flagged: bool
    heaviest_rank: int
    lightest_rank: int
    causes: tuple[str, ...] = field(default=())

    def summary(self) -> str:
        """One line for `tuner trials` and the report."""
        pct = "inf" if self.spread == float("inf") else f"{self.spread * 100:.0f}%"
        head = f"rank {self.heaviest_rank} peaks {pct} above rank {self.lightest_rank}"
        if not self.flagged:
            return f"balanced ({head})"
        return f"IMBALANCE: {head}; likely: " + "; ".join(c.split(":")[0] for c in self.causes)


def _peak_of(rank: Any) -> tuple[int, int]:
    return int(rank.rank), int(rank.peak_allocated or 0)


def spread(peaks: Iterable[int]) -> float:
    """``max / min - 1`` of the given peaks; 0.0 for fewer than two; inf when the smallest is 0 and the largest not."""
    values = list(peaks)
    if len(values) < 2:
        return 0.0
    low, high = min(values), max(values)
    if high <= 0:
        return 0.0
    if low <= 0:
        return float("inf")
    return high / low - 1.0


def likely_causes(heaviest_rank: int) -> tuple[str, ...]:
    """Most likely first: rank 0 standing out points at gathering/DataParallel, another rank at the data."""
    if heaviest_rank == 0:
        return (CAUSE_RANK0_GATHER, CAUSE_DATAPARALLEL, CAUSE_UNEVEN_DATA)
    return (CAUSE_UNEVEN_DATA, CAUSE_RANK0_GATHER, CAUSE_DATAPARALLEL)


def rank_imbalance(ranks: Iterable[Any], threshold: float = THRESHOLD) -> Imbalance | None:
    """The imbalance of a probe's ranks (trials.contract.RankMemory or a row's tuner.records.RankPeaks); None with fewer
    than two ranks."""
    if threshold < 0:
        raise ValueError("threshold must be >= 0")
    peaks: dict[int, int] = {}
    for rank in ranks:
        number, peak = _peak_of(rank)
        peaks[number] = max(peak, peaks.get(number, 0))
    if len(peaks) < 2:
        return None
    heaviest = max(peaks, key=lambda r: (peaks[r], -r))
    lightest = min((r for r in peaks if r != heaviest), key=lambda r: (peaks[r], r))
    value = spread(peaks.values())
    flagged = value > threshold
    return Imbalance(
        peaks=dict(sorted(peaks.items())),
        spread=value,
        flagged=flagged,
        heaviest_rank=heaviest,
        lightest_rank=lightest,
        causes=likely_causes(heaviest) if flagged else (),
    )


def probe_imbalance(result: Mapping[str, Any] | None, threshold: float = THRESHOLD) -> Imbalance | None:
    """The imbalance of a stored probe's result (a ProbeResult as JSON, e.g. ProbeRow.result), read through the one
    conversion of a stored result (tuner.records.Measurement); a row's own ``measurement.ranks`` go to
    rank_imbalance directly."""
    return rank_imbalance(Measurement.from_json(result).ranks, threshold)
