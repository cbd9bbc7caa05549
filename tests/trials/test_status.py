"""The one status enum (trials.status, re-exported by trials.contract): every place that reads a status reads its
properties from here (the rank's exit code, the verdict's severity, the retry rule, the listing order)."""

from __future__ import annotations

import pydantic
import pytest

from trials.contract import EXIT_CODES, ProbeResult, RankReason, RankResult, Status
from tuner.probing.verdict import exit_status, is_transient, telling_exit
from tuner.records import ProbeStatus


def test_the_probe_rows_status_is_the_contracts_enum() -> None:
    assert ProbeStatus is Status
    assert Status("inferred-oom") is Status.INFERRED_OOM and str(Status.HOST_OOM) == "host-oom"
    assert f"{Status.DEVICE_BUSY}" == "device-busy" and Status.OK == "ok"


def test_each_rank_status_has_its_exit_code_and_back() -> None:
    assert {s.value: s.exit_code for s in Status if s.from_rank} == {
        "ok": 0,
        "oom": 3,
        "error": 4,
        "timeout": 5,
        "host-oom": 6,
        "device-busy": 7,
        "killed": 8,
        "refused": 9,
    }
    assert {s: s.exit_code for s in Status if s.from_rank} == EXIT_CODES
    assert all(Status.of_exit_code(code) is s for s, code in EXIT_CODES.items())
    assert Status.of_exit_code(1) is None
    assert [s for s in Status if not s.from_rank] == [Status.INFERRED_OOM, Status.SKIPPED, Status.INTERRUPTED]


def test_a_rank_or_probe_result_refuses_a_status_no_rank_ends_with() -> None:
    for status in ("inferred-oom", "skipped", "interrupted"):
        with pytest.raises(pydantic.ValidationError, match="not one a probe ends with"):
            ProbeResult(status=status)
        with pytest.raises(pydantic.ValidationError):
            RankResult(rank=0, status=status)
        with pytest.raises(pydantic.ValidationError):
            RankReason(rank=0, status=status, cause="x", source="signal")
    assert RankResult.model_validate_json(RankResult(rank=1, status="oom").model_dump_json()).status is Status.OOM


def test_severity_orders_which_rank_names_a_probe() -> None:
    ranked = sorted((s for s in Status if s.from_rank), key=lambda s: s.severity)
    order = ["ok", "timeout", "error", "refused", "device-busy", "killed", "host-oom", "oom"]
    assert [s.value for s in ranked] == order


def test_transient_and_memory_verdicts() -> None:
    assert {s for s in Status if s.transient} == {Status.KILLED, Status.DEVICE_BUSY}
    assert is_transient(Status.KILLED, False) and is_transient(Status.OK, True) and not is_transient(Status.OOM, False)
    assert {s for s in Status if s.out_of_memory} == {Status.OOM, Status.INFERRED_OOM}
    assert {s for s in Status if s.device_verdict} == {Status.OK, Status.OOM}


def test_listing_order_puts_memory_failures_before_timeouts_and_errors() -> None:
    order = sorted(Status, key=lambda s: (s.listing_order, s.value))
    assert [s.value for s in order][:5] == ["ok", "oom", "host-oom", "timeout", "error"]
    assert {s.listing_order for s in order[5:]} == {6}


def test_an_exit_code_tells_a_class_only_beyond_ok_and_error() -> None:
    assert telling_exit(3) is Status.OOM and telling_exit(8) is Status.KILLED and telling_exit(-2) is Status.KILLED
    assert telling_exit(0) is None and telling_exit(4) is None
    assert telling_exit(1) is None and telling_exit(None) is None
    # a rank that exited 0 or EXIT_ERROR without a result: its stderr may still prove a class, else "error"
    assert exit_status(0, 4, "CUDA out of memory", None)[0] is Status.OOM
    assert exit_status(0, 0, "", None)[0] is Status.ERROR
