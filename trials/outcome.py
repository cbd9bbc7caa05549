"""How a probe rank ended, from the exception it raised: the status and exit code (``classify``), and the one line a
probe row's cause says (``one_line``)."""

from __future__ import annotations

import torch

from trials import memory
from trials.contract import EXIT_BUSY, EXIT_ERROR, EXIT_HOST_OOM, EXIT_OOM, EXIT_TIMEOUT, Status


def one_line(exc: BaseException) -> str:
    """The exception's type and first line, and its direct cause's (DeepSpeed raises "the op failed to build/load"
    from the compiler's error): what the probe row's cause says."""
    text = str(exc).strip().splitlines()
    first = next((line.strip() for line in text if line.strip()), "")
    line = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    cause = exc.__cause__
    if cause is not None and cause is not exc:
        inner = next((x.strip() for x in str(cause).strip().splitlines() if x.strip()), "")
        line += f" (caused by {type(cause).__name__}" + (f": {inner})" if inner else ")")
    return line[:500]


class DeviceBusy(RuntimeError):
    """The rank's GPU is in use by another process (see trials.contract.device_busy)."""


def classify(exc: BaseException, *, cuda: bool = False, device_full: bool = False) -> tuple[Status, int]:
    """The status and exit code of a rank that raised ``exc`` (trials.memory.memory_failure for memory failures)."""
    if isinstance(exc, DeviceBusy):
        return "device-busy", EXIT_BUSY
    kind = memory.memory_failure(exc, cuda=cuda, device_full=device_full, frames=memory.traceback_frames(exc))
    if kind == "oom":
        return "oom", EXIT_OOM
    if kind == "host-oom":
        return "host-oom", EXIT_HOST_OOM
    dist_error = getattr(torch.distributed, "DistError", ())
    if (isinstance(exc, dist_error) and "timed out" in str(exc).lower()) or isinstance(exc, TimeoutError):
        return "timeout", EXIT_TIMEOUT
    return "error", EXIT_ERROR
