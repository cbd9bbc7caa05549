"""Stable = the memory need (reserved + what lives outside the allocator, or the device-level use) under the headroom;
host-oom / device-busy / killed rows give the device frontier and the estimate nothing."""

from __future__ import annotations

from trials.contract import Knobs, ProbeResult, RankMemory
from tuner.job.objective import Objective
from tuner.memory.frontier import Frontier, device_fits
from tuner.probing.config import probe_config
from tuner.records import Fidelity, ProbeRow, ProbeStatus, is_stable
from tuner.search.evidence import Evidence, fits
from tuner.search.observation import probe_row
from tuner.search.study import memory_constraint

GiB = 1 << 30
KNOBS = Knobs(micro_batch_size=8, max_length=512, zero_stage=2)


def _row(result: ProbeResult, knobs: Knobs = KNOBS) -> ProbeRow:
    cfg = probe_config(knobs=knobs, device_memory=40 * GiB)
    return probe_row(
        cfg,
        result,
        trial_number=0,
        fidelity=Fidelity.SHORT,
        config_key="k" + str(knobs.micro_batch_size),
        estimate_bytes=None,
        objective=Objective(),
        device_memory=40 * GiB,
        headroom=0.9,
    )


def _ok(reserved: int, overhead: int = 0, used: int | None = None) -> ProbeResult:
    rank = RankMemory(
        rank=0,
        peak_allocated=reserved - GiB,
        peak_reserved=reserved,
        capacity=40 * GiB,
        overhead=overhead,
        device_used_peak=used,
    )
    return ProbeResult(status="ok", samples_per_s=10.0, tokens_per_s=5120.0, ranks=[rank], capacity=40 * GiB)


def test_stable_counts_the_memory_outside_the_caching_allocator() -> None:
    assert is_stable("ok", 35 * GiB, 40 * GiB, 0.9, 0)
    assert not is_stable("ok", 37 * GiB, 40 * GiB, 0.9, 0)
    assert _row(_ok(34 * GiB)).stable
    over = _row(_ok(34 * GiB, overhead=3 * GiB))  # 34 reserved + 3 of context and NCCL: over 36
    assert not over.stable and over.memory_need == 37 * GiB
    seen = _row(_ok(30 * GiB, overhead=GiB, used=37 * GiB))  # the sampled device use says more
    assert not seen.stable and seen.memory_need == 37 * GiB
    assert memory_constraint(seen, 0.9) > 0 and memory_constraint(_row(_ok(30 * GiB)), 0.9) < 0


def test_rows_without_per_rank_parts_fall_back_to_the_reserved_peak() -> None:
    row = ProbeRow(
        config_key="x",
        fidelity=Fidelity.SHORT,
        status=ProbeStatus.OK,
        knobs={},
        config={},
        peak_allocated=5,
        peak_reserved=7,
        result={},
    )
    assert row.memory_need == 7


def test_no_device_verdict_from_a_host_oom_a_busy_gpu_or_an_outside_kill() -> None:
    for status in ("host-oom", "device-busy", "killed", "timeout", "error"):
        assert device_fits(status, False) is None
        row = _row(ProbeResult(status=status, cause="x"))  # type: ignore[arg-type]
        assert fits(row) is None and not row.status.out_of_memory and not row.status.device_verdict
    assert device_fits("oom", False) is False and device_fits("ok", True) is True and device_fits("ok", False) is False
    assert ProbeStatus.KILLED.transient and ProbeStatus.DEVICE_BUSY.transient and not ProbeStatus.HOST_OOM.transient


def test_an_offloading_configs_host_oom_does_not_rule_out_the_configs_that_offload_nothing() -> None:
    evidence = Evidence(frontier=Frontier(zero_order=True))
    offload = Knobs(micro_batch_size=4, max_length=512, zero_stage=2, offload_optimizer=True)
    evidence.add(_row(ProbeResult(status="host-oom", cause="killed by the kernel's OOM killer"), offload))
    plain = Knobs(micro_batch_size=8, max_length=512, zero_stage=2).model_dump()
    assert evidence.frontier.infer(plain) is None
    evidence.add(_row(ProbeResult(status="oom", cause="CUDA out of memory"), offload))  # a device OOM does
    assert evidence.frontier.infer(plain) == "oom"
