"""The CUDA path's decisions as pure functions, on given numbers and real exceptions (no GPU here, no fake torch)."""

from __future__ import annotations

import time

import pytest
import torch

from trials.contract import (
    DEVICE_BUSY_BYTES,
    EXIT_KILLED,
    Knobs,
    ProbeResult,
    RankMemory,
    device_busy,
    memory_need,
)
from trials.measure import MemoryWindow, StepClock, split_steps, step_stats
from trials.memory import memory_failure, traceback_frames
from trials.models import placement
from trials.outcome import DeviceBusy, classify, launch_fault

GiB = 1 << 30


def test_memory_need_counts_what_lives_outside_the_allocator_or_the_sampled_device_use() -> None:
    assert memory_need(30 * GiB, 2 * GiB, None) == 32 * GiB  # context + NCCL on top of the reserve
    assert memory_need(30 * GiB, 2 * GiB, 35 * GiB) == 35 * GiB  # fragmentation / a foreign allocation seen
    assert memory_need(30 * GiB, 0, None) == 30 * GiB  # the emulated device: the peak itself
    rank = RankMemory(rank=0, peak_allocated=20 * GiB, peak_reserved=30 * GiB, overhead=GiB, device_used_peak=29 * GiB)
    assert rank.need == 31 * GiB
    result = ProbeResult(status="ok", ranks=[rank, RankMemory(rank=1, peak_allocated=1, peak_reserved=33 * GiB)])
    assert result.memory_need == 33 * GiB and result.overhead == GiB and result.device_used_peak == 29 * GiB


def test_device_busy_from_the_device_level_use_at_rank_start() -> None:
    assert not device_busy(600 << 20)  # our own context on Hopper
    assert device_busy(DEVICE_BUSY_BYTES + 1)
    assert device_busy(10 * GiB, threshold=4 * GiB) and not device_busy(3 * GiB, threshold=4 * GiB)


def _raised_in_pin_memory() -> BaseException:
    def pin_memory() -> None:
        raise RuntimeError("CUDA error: out of memory")

    try:
        pin_memory()
    except RuntimeError as exc:
        return exc
    raise AssertionError


def test_memory_failures_are_told_apart_on_cuda() -> None:
    assert memory_failure(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), cuda=True) == "oom"
    assert memory_failure(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"), cuda=True)
    assert memory_failure(MemoryError(), cuda=True) == "host-oom"
    assert memory_failure(RuntimeError("DefaultCPUAllocator: can't allocate memory"), cuda=True) == "host-oom"
    assert memory_failure(RuntimeError("cudaHostAlloc failed: out of memory"), cuda=True) == "host-oom"
    pinned = _raised_in_pin_memory()
    assert memory_failure(pinned, cuda=True, frames=traceback_frames(pinned)) == "host-oom"
    assert memory_failure(pinned, cuda=True) == "oom"  # the same text raised elsewhere is the device
    nccl = RuntimeError(
        "NCCL error in: ProcessGroupNCCL.cpp, unhandled cuda error, NCCL version 2.27: Cuda failure 'out of memory'"
    )
    assert memory_failure(nccl, cuda=True) == "oom"
    init = RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`")
    assert memory_failure(init, cuda=True, device_full=True) == "oom"
    assert memory_failure(init, cuda=True, device_full=False) is None
    assert memory_failure(ValueError("bad shape"), cuda=True) is None


def test_on_the_emulated_device_host_memory_is_the_device() -> None:
    assert memory_failure(MemoryError(), cuda=False) == "oom"
    assert memory_failure(RuntimeError("DefaultCPUAllocator: can't allocate memory"), cuda=False) == "oom"
    assert classify(MemoryError(), cuda=False)[0] == "oom"
    assert classify(MemoryError(), cuda=True)[0] == "host-oom"
    assert classify(DeviceBusy("GPU 0 holds 20 GiB"), cuda=True)[0] == "device-busy"
    assert classify(TimeoutError("x"))[0] == "timeout"
    assert classify(KeyError("x"))[0] == "error"


def test_an_interrupt_is_an_outside_stop_and_a_broken_fork_is_the_launchs_fault() -> None:
    assert classify(KeyboardInterrupt()) == ("killed", EXIT_KILLED)
    forked = RuntimeError("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, ...")
    assert launch_fault(forked) and classify(forked)[0] == "error"
    try:  # DeepSpeed / transformers re-raise: the fault is found in what the error was raised from
        try:
            raise RuntimeError("CUDA error: initialization error")
        except RuntimeError as inner:
            raise ValueError("could not build the engine") from inner
    except ValueError as outer:
        assert launch_fault(outer)
    assert not launch_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))


def test_the_memory_window_settles_after_the_first_real_step_and_holds_one_more() -> None:
    window = MemoryWindow(min_cycles=2)
    assert [window.record(True), window.record(True)] == ["settle", "done"]
    fp16 = MemoryWindow(min_cycles=2)  # loss scale 2^16: the first steps overflow and are skipped
    assert [fp16.record(s) for s in (False, False, True, False, True)] == ["more", "more", "settle", "more", "done"]
    assert fp16.skipped == 3
    never = MemoryWindow(min_cycles=2, extra_cycles=3)
    for _ in range(4):
        assert never.record(False) == "more"
    with pytest.raises(RuntimeError, match="skipped"):
        never.record(False)


def test_timing_window_composition() -> None:
    micro, boundary = split_steps([0.1, 0.3, 0.1, 0.35], [False, True, False, True])
    assert micro == [0.1, 0.1] and boundary == [0.3, 0.35]
    stats = step_stats(micro, boundary, accum=8)  # the probe ran accum 2; the job accumulates 8
    assert stats.cycle_s == pytest.approx(7 * 0.1 + 0.325)
    one = step_stats([], [0.2, 0.4], accum=1)
    assert one.cycle_s == pytest.approx(0.3) and one.micro_mean_s == pytest.approx(0.3)


def test_the_cpu_step_clock_times_between_marks() -> None:
    clock = StepClock(torch.device("cpu"))
    for _ in range(3):
        clock.mark()
        time.sleep(0.01)
    durations = clock.durations()
    assert len(durations) == 2 and all(d >= 0.009 for d in durations)
    assert clock.durations() == []


def test_where_the_model_is_built() -> None:
    zero3 = Knobs(micro_batch_size=1, max_length=8, zero_stage=3)
    assert placement(zero3, "cuda") == "zero-init"
    assert placement(Knobs(micro_batch_size=1, max_length=8, zero_stage=2), "cuda") == "device"
    assert placement(Knobs(micro_batch_size=1, max_length=8, engine="torch"), "cuda") == "device"
    assert placement(zero3, "cpu") == "host"  # the emulated device counts the module's tensors on the host


def test_deepspeed_probes_build_on_the_device_in_the_training_precision() -> None:
    """ZeRO 0-2 on CUDA built the model in fp32 on the device before DeepSpeed cast it: 2 bytes/param more reserve
    than the Trainer's run (its model is cast on the host, then moved), false "unstable" or setup OOMs (issue 23,
    defect 2). The plain torch engine trains fp32 under autocast; the host build (the emulated device) stays fp32."""
    from trials.contract import ModelSpec
    from trials.models import build_dtype, build_model

    bf16 = Knobs(micro_batch_size=1, max_length=8, zero_stage=2, precision="bf16")
    assert build_dtype(bf16, "device") is torch.bfloat16
    assert build_dtype(bf16.model_copy(update={"zero_stage": 3}), "zero-init") is torch.bfloat16
    assert build_dtype(bf16.model_copy(update={"precision": "fp16"}), "device") is torch.float16
    assert build_dtype(bf16.model_copy(update={"precision": "fp32"}), "device") is torch.float32
    assert build_dtype(bf16.model_copy(update={"engine": "torch"}), "device") is torch.float32
    assert build_dtype(bf16, "host") is torch.float32
    model = build_model(ModelSpec(source="builtin:tiny-t5"), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
