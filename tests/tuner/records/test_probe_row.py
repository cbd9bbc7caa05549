"""tuner.records.probe: a probe row's invariants, checked when it is built (RecordError), and an inferred row's
``ruled_out_by`` as data through the storage's one conversion (to_record / from_record)."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.cli.progress import ruled_out_lines
from tuner.records import Fidelity, ProbeRow, ProbeStatus, RecordError
from tuner.records.ruled_out import RuledOutBy

MEASURED = {"micro_batch_size": 8, "max_length": 128, "zero_stage": 3}


def columns(**values: Any) -> dict[str, Any]:
    return {
        "config_key": "k",
        "fidelity": "inferred",
        "status": "inferred-oom",
        "knobs": {"micro_batch_size": 16},
        **values,
    }


def test_an_inferred_row_says_what_ruled_it_out_and_has_no_result() -> None:
    with pytest.raises(RecordError, match="says what ruled it out"):
        ProbeRow("k", Fidelity.INFERRED, ProbeStatus.INFERRED_OOM, {}, {})
    with pytest.raises(RecordError, match="says what ruled it out"):
        ProbeRow("k", Fidelity.SHORT, ProbeStatus.INFERRED_OOM, {}, {}, ruled_out_by=RuledOutBy(stated="x"))
    with pytest.raises(RecordError, match="has no result"):
        ProbeRow(
            "k", Fidelity.INFERRED, ProbeStatus.INFERRED_OOM, {}, {}, result={}, ruled_out_by=RuledOutBy(stated="x")
        )
    with pytest.raises(RecordError, match="exactly one"):
        RuledOutBy(measured=MEASURED, estimate_bytes=5)


def test_a_measured_ok_row_has_its_result_and_its_peak() -> None:
    with pytest.raises(RecordError, match="result and its peak"):
        ProbeRow("k", Fidelity.SHORT, ProbeStatus.OK, {}, {}, peak_allocated=5)
    with pytest.raises(RecordError, match="result and its peak"):
        ProbeRow("k", Fidelity.CONFIRM, ProbeStatus.OK, {}, {}, result={})
    assert ProbeRow("k", Fidelity.SHORT, ProbeStatus.OK, {}, {}, result={}, peak_allocated=5).measured
    assert ProbeRow("k", Fidelity.SHORT, ProbeStatus.OOM, {}, {}).status.out_of_memory  # a failure needs neither


def test_ruled_out_by_is_stored_in_the_result_column_and_read_back_as_data() -> None:
    row = ProbeRow.from_record(columns(cause="anything at all", result={"ruled_out_by": {"measured": MEASURED}}))
    assert row.ruled_out_by == RuledOutBy(measured=MEASURED) and row.result is None
    stored = row.to_record()
    assert stored["result"] == {"ruled_out_by": {"measured": MEASURED}} and "ruled_out_by" not in stored
    assert ProbeRow.from_record(stored) == row
    estimated = RuledOutBy(estimate_bytes=900, margin=1.5)
    assert ProbeRow.from_record({**stored, "result": {"ruled_out_by": estimated.to_json()}}).ruled_out_by == estimated


def test_rows_stored_before_ruled_out_by_are_read_from_their_cause_once() -> None:
    old = ProbeRow.from_record(columns(cause="inferred-oom from measured micro=8 len=128 zero_stage=3", result=None))
    assert old.ruled_out_by == RuledOutBy(measured={"micro_batch_size": "8", "max_length": "128", "zero_stage": "3"})
    est = ProbeRow.from_record(columns(cause="inferred-oom: estimated peak 900 MiB > 1.5 x capacity", estimate_bytes=9))
    assert est.ruled_out_by == RuledOutBy(estimate_bytes=9)
    other = ProbeRow.from_record(columns(cause="inferred-oom: needs at least as much memory as trial 1"))
    assert other.ruled_out_by == RuledOutBy(stated="inferred-oom: needs at least as much memory as trial 1")


def test_the_progress_groups_by_the_record_not_by_the_cause_text() -> None:
    """Issue 20: tuner.cli.progress parsed the cause string back; it reads ruled_out_by now (a cause worded
    differently groups the same)."""
    rows = [
        ProbeRow.from_record(columns(cause=f"worded {i}", result={"ruled_out_by": {"measured": MEASURED}}))
        for i in range(3)
    ]
    [line] = ruled_out_lines(rows, None, {"micro=8 len=128 z3": (4, ProbeStatus.OOM)})
    assert line == "ruled out 3 configs (micro 16) without running: each needs at least trial 4's memory (an OOM)"
    estimate = ProbeRow.from_record(columns(cause="words", result={"ruled_out_by": {"estimate_bytes": 1}}))
    assert ruled_out_lines([estimate])[0].endswith("the memory estimate puts each far over the device memory")
