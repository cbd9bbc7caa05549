"""A CUDA rank's first steps (trials.cuda_setup), the CUDA calls mocked (no GPU here); the GPU check
(benchmarks/gpu_check.sh) runs them for real: issue 23, defects 7 and 13."""

from __future__ import annotations

import pytest
import torch

from trials import cuda_setup
from trials.contract import ProbeConfig
from trials.cuda_setup import eager_nccl_init, others_use, take_device, version_tuple
from trials.outcome import DeviceBusy, classify
from trials.probe import Probe

GPU = torch.device("cuda", 0)


def test_a_cuda_error_creating_the_context_is_a_busy_gpu_not_an_oom(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU too full for a context raises from set_device / the first mem_get_info: before, that was "oom" in setup,
    and the frontier spread it to every config of the stage."""

    def full(device: torch.device) -> None:
        raise torch.OutOfMemoryError("CUDA error: out of memory")

    monkeypatch.setattr(torch.cuda, "set_device", full)
    with pytest.raises(DeviceBusy) as info:
        take_device(GPU, threshold=2 << 30)
    assert classify(info.value, cuda=True)[0] == "device-busy"
    assert "CUDA_VISIBLE_DEVICES" in str(info.value)


def test_a_rank_forked_from_an_initialised_cuda_stays_the_launchs_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(device: torch.device) -> None:
        raise RuntimeError("CUDA error: initialization error")

    monkeypatch.setattr(torch.cuda, "set_device", broken)
    with pytest.raises(RuntimeError) as info:
        take_device(GPU, threshold=2 << 30)
    assert not isinstance(info.value, DeviceBusy)


def test_the_probe_takes_its_gpu_through_take_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe._setup_memory on CUDA: the context error becomes the rank's "device-busy" status."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def full(device: torch.device) -> None:
        raise RuntimeError("CUDA error: out of memory")  # torch.AcceleratorError on torch >= 2.9, a RuntimeError

    monkeypatch.setattr(torch.cuda, "set_device", full)
    probe = Probe(ProbeConfig.model_validate({"knobs": {"micro_batch_size": 1, "max_length": 8}}))
    with pytest.raises(DeviceBusy) as info:
        probe.dev.setup()
    assert probe.outcome(info.value)[0] == "device-busy"


def test_other_processes_use_from_nvml_only_when_it_lists_this_rank() -> None:
    assert others_use(None, 7) is None
    assert others_use([(1, 5 << 30)], 7) is None  # a PID namespace: this rank is not in NVML's list
    assert others_use([(7, 600 << 20)], 7) == 0  # its own context never counts
    assert others_use([(7, 600 << 20), (9, 3 << 30)], 7) == 3 << 30


def test_nvml_decides_busy_when_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    """Own context 3 GiB (above the fixed 2 GiB threshold): free, since NVML shows nobody else."""
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(cuda_setup, "device_used", lambda device: 3 << 30)
    monkeypatch.setattr(cuda_setup, "nvml_processes", lambda device: [(cuda_setup.os.getpid(), 3 << 30)])
    assert take_device(GPU, threshold=2 << 30, wait_s=0) == 3 << 30
    others = [(cuda_setup.os.getpid(), 600 << 20), (1, 1 << 30)]
    monkeypatch.setattr(cuda_setup, "nvml_processes", lambda device: others)
    with pytest.raises(DeviceBusy):
        take_device(GPU, threshold=2 << 30, wait_s=0)


def test_init_process_group_gets_device_id_only_where_it_is_safe() -> None:
    assert version_tuple("2.7.1+cu126") == (2, 7, 1) and version_tuple("2.13.0") == (2, 13, 0)
    assert eager_nccl_init("cuda", 4, "2.13.0+cu130")
    assert not eager_nccl_init("cuda", 1, "2.13.0+cu130")  # one rank: DeepSpeed passes none
    assert not eager_nccl_init("cuda", 4, "2.6.0+cu124")
    assert not eager_nccl_init("cuda", 4, "2.7.1")
    assert eager_nccl_init("cuda", 2, "2.8.0")
    assert not eager_nccl_init("cpu", 4, "2.13.0")
