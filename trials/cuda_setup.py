"""A CUDA rank's first steps, decided by small functions tested on CPU with the CUDA calls mocked: taking its GPU
(a CUDA error creating the context is a busy GPU, not an OOM of the config), who else uses the GPU (NVML's per-process
use where it lists this rank, else the device-level use against a threshold), and whether ``init_process_group`` gets
``device_id`` (eager NCCL init)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

import torch

from trials.contract import device_busy
from trials.measure import BUSY_WAIT_S, device_used, wait_for_free_device
from trials.outcome import DeviceBusy, launch_fault, one_line

# other processes' use (NVML, per pid) above this: the GPU is someone else's (a monitoring agent holds none)
OTHERS_BUSY_BYTES = 256 << 20


def take_device(device: torch.device, threshold: int, wait_s: float = BUSY_WAIT_S) -> int:
    """Makes ``device`` this rank's (its CUDA context is created here) and returns the device-level use then.

    A CUDA error while creating the context or reading the first use (a GPU too full for a context, one in exclusive
    mode held by another process) raises DeviceBusy, so the frontier never learns an "oom" of this config from it; a
    rank forked from a process that had initialised CUDA re-raises (the launch's fault, ``launch_fault``). Busy: other
    processes' use per pid from NVML when NVML lists this rank's own context (its own use then never counts), else the
    device-level use above ``threshold``, waited on ``wait_s`` (a killed predecessor's memory is freed lazily)."""
    try:
        torch.cuda.set_device(device)
        used = device_used(device)
    except RuntimeError as exc:
        if launch_fault(exc):
            raise
        raise DeviceBusy(
            f"GPU {device.index}: CUDA failed while this rank created its context ({one_line(exc)}): another process "
            "holds the GPU; free it or pick other GPUs (CUDA_VISIBLE_DEVICES)"
        ) from exc
    others = others_use(nvml_processes(device), os.getpid())
    if others is None:
        return wait_for_free_device(device, threshold, wait_s)
    if device_busy(others, OTHERS_BUSY_BYTES):
        raise DeviceBusy(
            f"GPU {device.index}: other processes hold {others / 2**30:.1f} GiB of it at rank start: another job is "
            "on it; free it or pick other GPUs (CUDA_VISIBLE_DEVICES)"
        )
    return used


def others_use(processes: Sequence[tuple[int, int]] | None, own_pid: int) -> int | None:
    """The bytes other processes use on the GPU from NVML's (pid, bytes) list, or None when it cannot tell: no list,
    or one without this rank (a PID namespace, a container: its pids are the host's)."""
    if processes is None or own_pid not in {pid for pid, _ in processes}:
        return None
    return sum(used for pid, used in processes if pid != own_pid)


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_v2_t (nvmlDeviceGetComputeRunningProcesses_v3)
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


def nvml_processes(device: torch.device) -> list[tuple[int, int]] | None:
    """(pid, bytes) of the compute processes on ``device`` (found by its PCI bus id), None where NVML cannot say."""
    bus = _pci_bus_id(device)
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if bus is None or nvml.nvmlInit_v2() != 0:
        return None
    try:
        handle = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(handle)) != 0:
            return None
        count = ctypes.c_uint(64)
        infos = (_ProcessInfo * 64)()
        if nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), infos) != 0:
            return None
        return [(int(infos[i].pid), int(infos[i].usedGpuMemory)) for i in range(count.value)]
    except AttributeError:  # a driver without the _v3 / _v2 symbols
        return None
    finally:
        nvml.nvmlShutdown()


def _pci_bus_id(device: torch.device) -> str | None:
    props = torch.cuda.get_device_properties(device)
    domain, bus, dev = (getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device"))
    if bus is None or dev is None:
        return None
    return f"{domain or 0:08x}:{bus:02x}:{dev:02x}.0"


def version_tuple(version: str) -> tuple[int, ...]:
    """``"2.7.1+cu126"`` -> (2, 7, 1)."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def eager_nccl_init(device_type: str, world_size: int, torch_version: str) -> bool:
    """Whether ``init_process_group`` gets ``device_id`` (NCCL's communicators then exist, and count, before the
    memory window): on CUDA with more than one rank, never on torch 2.6.0-2.7.1, whose eager init with a bound device
    breaks later collectives (DeepSpeed passes none there either). One rank: no communicator to create."""
    if device_type != "cuda" or world_size <= 1:
        return False
    return not (2, 6, 0) <= version_tuple(torch_version) <= (2, 7, 1)
