"""Per-rank imbalance: spread, the 20% flag and the likely causes by which rank stands out."""

from __future__ import annotations

import math

import pytest

from trials.contract import ProbeResult, RankMemory
from tuner.memory.imbalance import (
    CAUSE_DATAPARALLEL,
    CAUSE_RANK0_GATHER,
    CAUSE_UNEVEN_DATA,
    THRESHOLD,
    probe_imbalance,
    rank_imbalance,
    spread,
)
from tuner.records.measurement import RankPeaks

MiB = 1 << 20


def ranks(*peaks: int) -> list[RankMemory]:
    return [RankMemory(rank=i, peak_allocated=p, peak_reserved=p) for i, p in enumerate(peaks)]


def test_threshold_is_twenty_percent() -> None:
    assert pytest.approx(0.20) == THRESHOLD


def test_single_rank_has_no_imbalance() -> None:
    assert rank_imbalance(ranks(100 * MiB)) is None
    assert rank_imbalance([]) is None


def test_equal_ranks_are_balanced() -> None:
    imb = rank_imbalance(ranks(100 * MiB, 100 * MiB, 100 * MiB, 100 * MiB))
    assert imb is not None and not imb.flagged
    assert imb.spread == 0.0
    assert imb.causes == ()
    assert imb.summary() == "balanced (rank 0 peaks 0% above rank 1)"


@pytest.mark.parametrize(
    ("peaks", "flagged"),
    [
        ((100, 119), False),
        ((100, 120), False),  # exactly 20% is not "over 20%"
        ((100, 121), True),
        ((121, 100), True),
        ((100, 100, 100, 150), True),
        ((1000, 1100, 1050, 1000), False),
    ],
)
def test_flag_is_strictly_over_twenty_percent(peaks: tuple[int, ...], flagged: bool) -> None:
    imb = rank_imbalance(ranks(*(p * MiB for p in peaks)))
    assert imb is not None
    assert imb.flagged is flagged
    assert imb.spread == pytest.approx(max(peaks) / min(peaks) - 1)


def test_rank0_heaviest_points_at_gathering_and_dataparallel_first() -> None:
    imb = rank_imbalance(ranks(300 * MiB, 100 * MiB))
    assert imb is not None and imb.flagged
    assert imb.heaviest_rank == 0 and imb.lightest_rank == 1
    assert imb.causes[:2] == (CAUSE_RANK0_GATHER, CAUSE_DATAPARALLEL)
    assert set(imb.causes) == {CAUSE_RANK0_GATHER, CAUSE_DATAPARALLEL, CAUSE_UNEVEN_DATA}
    line = imb.summary()
    assert "IMBALANCE" in line and "rank 0" in line and "200%" in line
    assert "rank-0 gathering" in line and "DataParallel" in line and "uneven data" in line
    assert "\n" not in line


def test_other_rank_heaviest_points_at_uneven_data_first() -> None:
    imb = rank_imbalance(ranks(100 * MiB, 100 * MiB, 180 * MiB))
    assert imb is not None and imb.flagged
    assert imb.heaviest_rank == 2
    assert imb.causes[0] == CAUSE_UNEVEN_DATA


def test_zero_peak_rank_against_nonzero_is_infinite_spread() -> None:
    assert math.isinf(spread([0, 5]))
    assert spread([0, 0]) == 0.0
    imb = rank_imbalance(ranks(0, 5 * MiB))
    assert imb is not None and imb.flagged and "inf" in imb.summary()


def test_custom_threshold_and_negative_threshold() -> None:
    imb = rank_imbalance(ranks(100, 110), threshold=0.05)
    assert imb is not None and imb.flagged
    with pytest.raises(ValueError):
        rank_imbalance(ranks(100, 110), threshold=-1)


def test_reads_a_stored_result_through_its_typed_measurement() -> None:
    result = ProbeResult(status="ok", ranks=ranks(100 * MiB, 130 * MiB))
    row = {"result": result.model_dump(mode="json")}
    imb = probe_imbalance(row["result"])
    assert imb is not None and imb.flagged and imb.peaks == {0: 100 * MiB, 1: 130 * MiB}
    assert probe_imbalance(None) is None
    assert probe_imbalance({"status": "oom", "ranks": []}) is None


def test_duplicate_rank_entries_keep_the_max() -> None:
    imb = rank_imbalance([RankPeaks(0, 10), RankPeaks(0, 30), RankPeaks(1, 30)])
    assert imb is not None and imb.peaks == {0: 30, 1: 30} and not imb.flagged
