"""Versions and the hardware fingerprint stored with every probe result (results are only comparable on one)."""

from __future__ import annotations

import functools
import os
import platform
import socket
from importlib import metadata

import torch

from trials.contract import DEFAULT_PINNED_ALLOC, PINNED_ALLOC_ENV, alloc_conf_in_force


@functools.cache
def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    # accelerate prepares FSDP2 (its fp32 upcast of trainable parameters under mixed precision holds from 1.14)
    for dist in ("deepspeed", "transformers", "accelerate"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def fingerprint(device: torch.device | None = None) -> dict[str, str | int | float]:
    out: dict[str, str | int | float] = {
        "host": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count() or 0,
        "mem_total": _mem_total(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        # the caching allocator's settings this rank ran with: the alloc_conf knob, or what the user's shell set
        "alloc_conf": alloc_conf_in_force(os.environ) or "",
    }
    if torch.cuda.is_available():
        index = device.index if device is not None and device.type == "cuda" and device.index is not None else 0
        props = torch.cuda.get_device_properties(index)
        out.update(gpu_name=props.name, gpu_count=torch.cuda.device_count(), gpu_capacity=int(props.total_memory))
        # the arch list this rank's DeepSpeed ops were built and loaded with (tuner.probing.arch_list)
        out["cuda_arch_list"] = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
        # how the engine's setup pinned host memory for CPU offload (trials.pinned: the probe's, not the user's)
        out["pinned_alloc"] = os.environ.get(PINNED_ALLOC_ENV) or DEFAULT_PINNED_ALLOC
    else:
        out.update(gpu_name="", gpu_count=0, gpu_capacity=0)
    return out
