"""tuner.records.measurement: a probe row's stored result, typed (ProbeRow.measurement): per rank, its peaks and the
peak of each phase of the memory window; rows stored before the phases read with none."""

from __future__ import annotations

from typing import Any

import pytest

from trials.contract import ProbeResult, RankMemory
from tuner.records import Fidelity, ProbeRow, ProbeStatus, RecordError
from tuner.records.measurement import Measurement

MiB = 1 << 20


def ok_row(result: dict[str, Any]) -> ProbeRow:
    return ProbeRow("k", Fidelity.SHORT, ProbeStatus.OK, {}, {}, peak_allocated=1, result=result)


def probe_result(*phases: dict[str, int]) -> dict[str, Any]:
    ranks = [
        RankMemory(rank=i, peak_allocated=max(p.values()), peak_reserved=max(p.values()) + MiB, phases=p)
        for i, p in enumerate(phases)
    ]
    return ProbeResult(status="ok", ranks=ranks, phase="generate", fingerprint={"gpu": "H100"}).model_dump(mode="json")


def test_the_row_reads_per_rank_and_per_phase_peaks_as_the_probe_stored_them() -> None:
    stored = probe_result({"train": 5 * MiB, "eval_forward": 3 * MiB}, {"train": 6 * MiB, "eval_forward": 2 * MiB})
    m = ok_row(stored).measurement
    assert [r.rank for r in m.ranks] == [0, 1]
    assert m.ranks[1].phases == {"train": 6 * MiB, "eval_forward": 2 * MiB}
    assert (
        m.phase_peaks == ProbeResult.model_validate(stored).phase_peaks == {"train": 6 * MiB, "eval_forward": 3 * MiB}
    )
    assert m.ranks_differ and m.phase == "generate" and m.fingerprint == {"gpu": "H100"}
    assert ok_row(stored).memory_need == 7 * MiB  # the most over ranks of trials.contract.memory_need


def test_a_row_stored_before_the_phases_reads_with_none() -> None:
    old = {"status": "ok", "ranks": [{"rank": 0, "peak_allocated": 4 * MiB, "peak_reserved": 5 * MiB}]}
    m = ok_row(old).measurement
    assert m.phase_peaks == {} and not m.ranks_differ and m.ranks[0].peak_allocated == 4 * MiB
    assert Measurement.from_json(None) == Measurement()


def test_identical_ranks_do_not_differ() -> None:
    same = {"train": MiB, "generate": 2 * MiB}
    assert not ok_row(probe_result(same, dict(same))).measurement.ranks_differ


def test_a_rank_without_its_number_is_a_record_error() -> None:
    with pytest.raises(RecordError, match="no rank number"):
        Measurement.from_json({"ranks": [{"peak_allocated": 1}]})
