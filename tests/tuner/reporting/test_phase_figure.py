"""The report's per-phase peaks (issue 22 §2): one bar group per measured probe, per rank where its ranks differ, from
the rows' typed measurement (tuner.reporting.figures.phase_peaks); nothing for rows stored before the phases."""

from __future__ import annotations

from typing import Any

from tuner.records import Fidelity, ProbeRow, ProbeStatus
from tuner.reporting import figures

MiB = 1 << 20


def row(row_id: int, *phases: dict[str, int], fidelity: Fidelity = Fidelity.SHORT) -> ProbeRow:
    ranks: list[dict[str, Any]] = [
        {"rank": i, "peak_allocated": max(p.values(), default=MiB), "phases": p} for i, p in enumerate(phases)
    ]
    return ProbeRow(
        f"k{row_id}",
        fidelity,
        ProbeStatus.OK,
        {"micro_batch_size": row_id, "zero_stage": 2},
        {},
        trial_number=None if fidelity == Fidelity.CONFIRM else row_id,
        peak_allocated=MiB,
        result={"status": "ok", "ranks": ranks},
        id=row_id,
    )


def test_the_figure_groups_each_probes_phase_peaks_and_splits_ranks_that_differ() -> None:
    same = {"train": 4 * MiB, "eval_forward": 2 * MiB}
    fig = figures.phase_peaks(
        [
            row(1, same, dict(same)),
            row(2, {"train": 8 * MiB, "generate": 6 * MiB}, {"train": 5 * MiB}),
            row(3, {"train": MiB}, fidelity=Fidelity.CONFIRM),
        ]
    )
    assert fig is not None
    by_phase = {t.name: list(t.y) for t in fig.data}
    # each bar named by its trial and config; a confirm probe (no trial) by its kind, never "tNone" (issue 40 §5)
    assert list(fig.data[0].x) == ["t1 micro=1 z2", "t2 micro=2 z2 r0", "t2 micro=2 z2 r1", "confirm micro=3 z2"]
    assert by_phase == {
        "train": [4.0, 8.0, 5.0, 1.0],
        "eval forward": [2.0, None, None, None],
        "generate": [None, 6.0, None, None],
    }


def test_rows_without_phases_give_no_figure() -> None:
    assert figures.phase_peaks([row(1, {})]) is None
    assert figures.phase_peaks([]) is None


def test_the_report_page_carries_the_figure_only_where_phases_are_stored() -> None:
    from tuner.records import StudyDefinition
    from tuner.reporting.html import ReportData, render_html

    phased = render_html(ReportData("s", StudyDefinition(), [row(1, {"train": MiB})], None, None))
    assert "Peak memory per phase" in phased
    assert "Peak memory per phase" not in render_html(ReportData("s", StudyDefinition(), [row(1, {})], None, None))
